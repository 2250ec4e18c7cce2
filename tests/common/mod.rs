//! Shared by the integration tests: store backends and an engine test kit, and for the crash
//! tests a deterministic workload of guarded batches whose every batch is recognisable after a
//! crash, the model of what each prefix of it leaves, and a checker.
//!
//! Each test binary uses a different part of this module, hence the allowance below.
#![allow(dead_code)]

pub mod backends;
pub mod backup;
pub mod chat_versions;
pub mod check;
pub mod crash;
pub mod disk;
pub mod engine;
#[cfg(feature = "etcd")]
pub mod etcd;
pub mod generate;
pub mod killable;
pub mod layout;
pub mod logs;
pub mod os_files;
pub mod owners;
pub mod rng;
pub mod steps;
pub mod traced;
pub mod workload;
pub mod world;
pub mod world_owners;
