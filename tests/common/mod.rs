//! Shared by the crash tests: a deterministic workload of guarded batches whose every batch is
//! recognisable after a crash, the model of what each prefix of it leaves, and a checker.
//!
//! Each test binary uses a different part of this module, hence the allowance below.
#![allow(dead_code)]

pub mod check;
pub mod layout;
pub mod logs;
pub mod rng;
pub mod workload;
