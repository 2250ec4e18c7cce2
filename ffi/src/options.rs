//! Options for `pc_engine_open` (SPEC E2): an opaque handle set through functions, so options
//! are added without changing any struct a compiled caller knows. Flags and numbers are
//! separate constant families whose values do not overlap each other or any other family, and
//! each setter refuses a value of another family.
//!
//! Owns: the `pc_engine_options` handle, its setters, and turning it into an engine builder.

use std::ffi::c_char;
use std::sync::Arc;
use std::time::Duration;

use portcullis::engine::{Engine, EngineBuilder};
use portcullis::fence::FenceConfig;
use portcullis::store::SyncPolicy;
use portcullis::{Error, Namespace, SharedClock};

use crate::boundary::{Fail, arg, arg_mut, boundary, boundary_void, invalid, out_ptr, text};
use crate::engine::namespace;
use crate::error::pc_error;
use crate::machine::CMachine;
use crate::store::{pc_clock, pc_store, pc_sync_policy, sync_policy};

/// Options for `pc_engine_open`, reusable for several opens. One thread at a time.
#[derive(Default)]
pub struct pc_engine_options {
    directory: Option<String>,
    /// A store handle's store, with the process generation it was opened in (SPEC E3 fork).
    store: Option<(Arc<dyn portcullis::store::Store>, u64)>,
    clock: Option<SharedClock>,
    sync: Option<SyncPolicy>,
    owner: Option<String>,
    own: Vec<(Namespace, bool)>,
    flags: Vec<(pc_flag, bool)>,
    numbers: Vec<(pc_number, u64)>,
    fence: Option<FenceConfig>,
    /// The listener (`pc_engine_options_listener`, SPEC E8).
    pub(crate) listener: Option<Arc<dyn portcullis::observe::Listener>>,
}

/// A boolean option (`pc_engine_options_flag`).
pub type pc_flag = u32;
/// Flag: the first call on a namespace nobody holds adopts it (default true).
pub const PC_ADOPT_ON_FIRST_USE: pc_flag = 0x0201;
/// Flag: a write to an unregistered entity registers it (default false).
pub const PC_REGISTER_ON_FIRST_WRITE: pc_flag = 0x0202;
/// Flag: `pc_engine_checkpoint` also truncates the history it covers (default false).
pub const PC_TRUNCATE_AFTER_CHECKPOINT: pc_flag = 0x0203;
/// Flag: opening starts a background warm (default false).
pub const PC_WARM_ON_OPEN: pc_flag = 0x0204;
/// Flag: a sweeper thread deletes expired leased-shard rows of the namespaces this engine
/// serves (SPEC F9; default true).
pub const PC_SWEEP_EXPIRED_LEASES: pc_flag = 0x0205;
/// Flag: the background warm restores, one at a time at the lowest priority, the entities
/// that owe work (unclean-restart repairs, deferred records) so none waits for a touch (SPEC
/// R6; default true). Off: entities restore only on their first touch or `pc_engine_warm`.
pub const PC_BACKGROUND_WARM: pc_flag = 0x0206;

/// A numeric option (`pc_engine_options_number`).
pub type pc_number = u32;
/// Number: threads in the engine's pool (default: the cores available).
pub const PC_POOL_THREADS: pc_number = 0x0301;
/// Number: entities a warm restores at once (default 4).
pub const PC_WARM_PARALLELISM: pc_number = 0x0302;
/// Number: a checkpoint whenever a write leaves this many records after the newest (default
/// none).
pub const PC_CHECKPOINT_EVERY: pc_number = 0x0303;
/// Number: a restore that folds more records than this publishes a checkpoint (default 10,000).
pub const PC_CHECKPOINT_TAIL_BOUND: pc_number = 0x0304;
/// Number: how long close waits for the warm, drivers and calls in flight, in ms (default
/// 30,000).
pub const PC_CLOSE_TIMEOUT_MS: pc_number = 0x0305;
/// Number: how often the lease sweeper runs, in ms (at least 1).
pub const PC_SWEEP_INTERVAL_MS: pc_number = 0x0306;
/// Number: at most this many restored entities stay in memory; the least recently used idle
/// ones are passivated and restore again on their next touch (SPEC R10; default: no bound).
pub const PC_MAX_RESIDENT_ENTITIES: pc_number = 0x0307;
/// Number: the stack size of each pool thread, in bytes (at least 65,536; default 2 MiB). The
/// state machine runs there during a warm: an interpreter behind it may need more.
pub const PC_POOL_STACK_SIZE: pc_number = 0x0308;

/// Creates options with every default (no directory and no store yet: set one).
///
/// # Safety
/// `out` writable. Thread safety: any thread; the options are then one thread's at a time.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_options_new(
    out: *mut *mut pc_engine_options,
    err: *mut pc_error,
) -> u32 {
    boundary(err, || {
        // SAFETY: the caller's contract.
        let out = unsafe { out_ptr(out, "out") }?;
        out.set(Box::into_raw(Box::default()));
        Ok::<(), Error>(())
    })
}

/// Frees options. Null is a no-op.
///
/// # Safety
/// `options` null or from `pc_engine_options_new`, not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_options_free(options: *mut pc_engine_options) {
    boundary_void(|| {
        if !options.is_null() {
            // SAFETY: from `Box::into_raw`, freed once.
            drop(unsafe { Box::from_raw(options) });
        }
    });
}

fn set<E: Into<Fail>>(
    options: *mut pc_engine_options,
    err: *mut pc_error,
    f: impl FnOnce(&mut pc_engine_options) -> Result<(), E>,
) -> u32 {
    boundary(err, || {
        // SAFETY: every setter's contract: `options` live, one thread at a time.
        match unsafe { arg_mut(options, "options") } {
            Ok(o) => f(o).map_err(Into::into),
            Err(e) => Err(e.into()),
        }
    })
}

/// Opens the file store in `dir` (created if missing). Either this or `pc_engine_options_store`.
///
/// # Safety
/// `options` live; `dir` NUL-terminated. Thread safety: one thread at a time per options.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_options_directory(
    options: *mut pc_engine_options,
    dir: *const c_char,
    err: *mut pc_error,
) -> u32 {
    set(options, err, |o| {
        // SAFETY: the caller's contract.
        o.directory = Some(unsafe { text(dir, "dir") }?.to_owned());
        Ok::<(), Error>(())
    })
}

/// Opens over an already open store (shared: several engines may share one, as owners).
/// The engine keeps its own reference; the store handle may be freed before the engine.
///
/// # Safety
/// `options`, `store` live. Thread safety: one thread at a time per options.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_options_store(
    options: *mut pc_engine_options,
    store: *const pc_store,
    err: *mut pc_error,
) -> u32 {
    set(options, err, |o| {
        // SAFETY: the caller's contract.
        let store = unsafe { arg(store, "store") }?;
        crate::fork::check(store.generation, "store")?;
        o.store = Some((Arc::clone(&store.store), store.generation));
        Ok::<(), Fail>(())
    })
}

/// The engine's clock (with a directory the store runs on it too; with a store it must be
/// the store's clock).
///
/// # Safety
/// `options`, `clock` live. Thread safety: one thread at a time per options.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_options_clock(
    options: *mut pc_engine_options,
    clock: *const pc_clock,
    err: *mut pc_error,
) -> u32 {
    set(options, err, |o| {
        // SAFETY: the caller's contract.
        o.clock = Some(unsafe { arg(clock, "clock") }?.shared());
        Ok::<(), Error>(())
    })
}

/// The file store's sync policy (`PC_SYNC_*`), with a directory only.
///
/// # Safety
/// `options` live. Thread safety: one thread at a time per options.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_options_sync_policy(
    options: *mut pc_engine_options,
    policy: pc_sync_policy,
    interval_ms: u64,
    err: *mut pc_error,
) -> u32 {
    set(options, err, |o| {
        o.sync = Some(sync_policy(policy, interval_ms)?);
        Ok::<(), Error>(())
    })
}

/// The owner id (SPEC F11; engines sharing a store need distinct ids). Default `"default"`.
///
/// # Safety
/// `options` live; `owner` NUL-terminated. Thread safety: one thread at a time per options.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_options_owner(
    options: *mut pc_engine_options,
    owner: *const c_char,
    err: *mut pc_error,
) -> u32 {
    set(options, err, |o| {
        // SAFETY: the caller's contract.
        o.owner = Some(unsafe { text(owner, "owner") }?.to_owned());
        Ok::<(), Error>(())
    })
}

/// Adopts namespace `ns` at open, fenced (`unfenced` false) or unfenced. May be repeated.
///
/// # Safety
/// `options` live; `ns` NUL-terminated. Thread safety: one thread at a time per options.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_options_own(
    options: *mut pc_engine_options,
    ns: *const c_char,
    unfenced: bool,
    err: *mut pc_error,
) -> u32 {
    set(options, err, |o| {
        o.own.push((namespace(ns)?, unfenced));
        Ok::<(), Error>(())
    })
}

/// Sets a boolean option (`PC_ADOPT_ON_FIRST_USE` ...); any other value (another family's
/// constant included) answers `PC_INVALID_ARGUMENT` and changes nothing.
///
/// # Safety
/// `options` live. Thread safety: one thread at a time per options.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_options_flag(
    options: *mut pc_engine_options,
    flag: pc_flag,
    on: bool,
    err: *mut pc_error,
) -> u32 {
    set(options, err, |o| {
        if !matches!(flag, PC_ADOPT_ON_FIRST_USE..=PC_BACKGROUND_WARM) {
            return Err(invalid(
                "flag",
                &format!("{flag:#x} is not a PC_* flag ({})", crate::family_of(flag)),
            ));
        }
        o.flags.push((flag, on));
        Ok(())
    })
}

/// Sets a numeric option (`PC_POOL_THREADS` ...); any other value (another family's constant
/// included) answers `PC_INVALID_ARGUMENT` and changes nothing. Zero where at least 1 is
/// needed is refused by `pc_engine_open`.
///
/// # Safety
/// `options` live. Thread safety: one thread at a time per options.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_options_number(
    options: *mut pc_engine_options,
    option: pc_number,
    value: u64,
    err: *mut pc_error,
) -> u32 {
    set(options, err, |o| {
        if !matches!(option, PC_POOL_THREADS..=PC_POOL_STACK_SIZE) {
            return Err(invalid(
                "option",
                &format!(
                    "{option:#x} is not a PC_* number option ({})",
                    crate::family_of(option)
                ),
            ));
        }
        o.numbers.push((option, value));
        Ok(())
    })
}

/// Epoch fencing parameters (SPEC F), in ms. Refused (`PC_INVALID_ARGUMENT`) unless
/// `lease_margin_ms > 0` and `epoch_lease_ms > lease_margin_ms + min_lease_budget_ms`.
///
/// # Safety
/// `options` live. Thread safety: one thread at a time per options.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pc_engine_options_fence(
    options: *mut pc_engine_options,
    epoch_lease_ms: u64,
    lease_margin_ms: u64,
    min_lease_budget_ms: u64,
    max_apply_window_ms: u64,
    err: *mut pc_error,
) -> u32 {
    set(options, err, |o| {
        let config = FenceConfig::builder()
            .epoch_lease_ms(epoch_lease_ms)
            .lease_margin_ms(lease_margin_ms)
            .min_lease_budget_ms(min_lease_budget_ms)
            .max_apply_window_ms(max_apply_window_ms)
            .build()?;
        o.fence = Some(config);
        Ok::<(), Error>(())
    })
}

fn size(value: u64) -> Result<usize, Error> {
    usize::try_from(value).map_err(|_| invalid("value", "does not fit a size_t"))
}

fn number(
    b: EngineBuilder<CMachine>,
    option: pc_number,
    value: u64,
) -> Result<EngineBuilder<CMachine>, Error> {
    Ok(match option {
        PC_POOL_THREADS => b.pool_threads(size(value)?),
        PC_WARM_PARALLELISM => b.warm_parallelism(size(value)?),
        PC_CHECKPOINT_EVERY => b.checkpoint_every(value),
        PC_CHECKPOINT_TAIL_BOUND => b.checkpoint_tail_bound(value),
        PC_CLOSE_TIMEOUT_MS => b.close_timeout(Duration::from_millis(value)),
        PC_SWEEP_INTERVAL_MS => b.sweep_interval(Duration::from_millis(value)),
        PC_MAX_RESIDENT_ENTITIES => b.max_resident_entities(size(value)?),
        _ => b.pool_stack_size(size(value)?),
    })
}

/// Opens an engine over `machine` with these options. A store from before a fork is refused.
pub(crate) fn open(o: &pc_engine_options, machine: CMachine) -> Result<Engine<CMachine>, Fail> {
    let mut b = Engine::builder(machine);
    if let Some(dir) = &o.directory {
        b = b.directory(dir);
    }
    if let Some((store, generation)) = &o.store {
        crate::fork::check(*generation, "store")?;
        b = b.store(Arc::clone(store));
    }
    if let Some(clock) = &o.clock {
        b = b.clock(Arc::clone(clock));
    }
    if let Some(policy) = o.sync {
        b = b.sync_policy(policy);
    }
    if let Some(owner) = &o.owner {
        b = b.owner(owner.clone());
    }
    for (ns, unfenced) in &o.own {
        b = if *unfenced {
            b.own_unfenced(ns.clone())
        } else {
            b.own(ns.clone())
        };
    }
    for &(flag, on) in &o.flags {
        b = match flag {
            PC_ADOPT_ON_FIRST_USE => b.adopt_on_first_use(on),
            PC_REGISTER_ON_FIRST_WRITE => b.register_on_first_write(on),
            PC_TRUNCATE_AFTER_CHECKPOINT => b.truncate_after_checkpoint(on),
            PC_WARM_ON_OPEN => b.warm_on_open(on),
            PC_BACKGROUND_WARM => b.background_warm(on),
            _ => b.sweep_expired_leases(on),
        };
    }
    for &(option, value) in &o.numbers {
        b = number(b, option, value)?;
    }
    if let Some(config) = o.fence {
        b = b.fence_config(config);
    }
    if let Some(listener) = &o.listener {
        b = b.listener(Arc::clone(listener));
    }
    Ok(b.open()?)
}
