//! The fence's parameters (SPEC F header), validated once at construction.

use crate::error::{Error, Result};

/// Timing parameters of a fence (SPEC F header).
///
/// Build one with [`FenceConfig::builder`]; [`FenceConfigBuilder::build`] refuses a
/// configuration unless `lease_margin_ms > 0` and
/// `epoch_lease_ms > lease_margin_ms + min_lease_budget_ms`.
///
/// Safety assumes `lease_margin_ms` exceeds the largest skew between any two clocks involved
/// (the planner's and the store's). That is documented, not checked.
///
/// ```
/// use portcullis::fence::FenceConfig;
/// let config = FenceConfig::builder().epoch_lease_ms(10_000).lease_margin_ms(2_000).build().unwrap();
/// assert_eq!(config.epoch_lease_ms(), 10_000);
/// assert!(FenceConfig::builder().lease_margin_ms(0).build().is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FenceConfig {
    epoch_lease_ms: u64,
    lease_margin_ms: u64,
    min_lease_budget_ms: u64,
    max_apply_window_ms: u64,
}

impl Default for FenceConfig {
    fn default() -> Self {
        FenceConfig {
            epoch_lease_ms: 30_000,
            lease_margin_ms: 5_000,
            min_lease_budget_ms: 1_000,
            max_apply_window_ms: 10_000,
        }
    }
}

impl FenceConfig {
    /// A builder starting from the defaults.
    pub fn builder() -> FenceConfigBuilder {
        FenceConfigBuilder {
            config: FenceConfig::default(),
        }
    }

    /// How long a lease grant lasts, in ms (default 30,000).
    pub fn epoch_lease_ms(&self) -> u64 {
        self.epoch_lease_ms
    }

    /// The safety margin subtracted from every lease expiry, in ms (default 5,000).
    pub fn lease_margin_ms(&self) -> u64 {
        self.lease_margin_ms
    }

    /// The least time a lease must have left (after the margin) to be used, in ms (default 1,000).
    pub fn min_lease_budget_ms(&self) -> u64 {
        self.min_lease_budget_ms
    }

    /// The longest a planned write may wait before it applies, in ms (default 10,000).
    pub fn max_apply_window_ms(&self) -> u64 {
        self.max_apply_window_ms
    }
}

/// Builds a [`FenceConfig`]; every setter documents its default.
#[derive(Clone, Debug)]
pub struct FenceConfigBuilder {
    config: FenceConfig,
}

impl FenceConfigBuilder {
    /// How long a lease grant lasts, in ms. Default 30,000.
    pub fn epoch_lease_ms(mut self, ms: u64) -> Self {
        self.config.epoch_lease_ms = ms;
        self
    }

    /// The safety margin, in ms; must exceed the largest clock skew. Default 5,000.
    pub fn lease_margin_ms(mut self, ms: u64) -> Self {
        self.config.lease_margin_ms = ms;
        self
    }

    /// The least usable time a lease must have left, in ms. Default 1,000.
    pub fn min_lease_budget_ms(mut self, ms: u64) -> Self {
        self.config.min_lease_budget_ms = ms;
        self
    }

    /// The longest a planned write may wait before it applies, in ms. Default 10,000.
    pub fn max_apply_window_ms(mut self, ms: u64) -> Self {
        self.config.max_apply_window_ms = ms;
        self
    }

    /// Validates the parameters (SPEC F header).
    pub fn build(self) -> Result<FenceConfig> {
        let c = self.config;
        if c.lease_margin_ms == 0 {
            return Err(Error::invalid("lease_margin_ms must be greater than 0"));
        }
        let floor = c.lease_margin_ms.checked_add(c.min_lease_budget_ms);
        if floor.is_none_or(|floor| c.epoch_lease_ms <= floor) {
            return Err(Error::invalid(format!(
                "epoch_lease_ms ({}) must exceed lease_margin_ms ({}) + min_lease_budget_ms ({})",
                c.epoch_lease_ms, c.lease_margin_ms, c.min_lease_budget_ms
            )));
        }
        if c.max_apply_window_ms == 0 {
            return Err(Error::invalid("max_apply_window_ms must be greater than 0"));
        }
        Ok(c)
    }
}
