//! The file-backed store: one shared journal of segment files with a chain of records per
//! partition, group commit, lazy per-partition indexes, recovery and compaction.
//! See `docs/DESIGN.md` for the on-disk format and the reasoning behind it.

mod vfs;

pub use vfs::{OpenMode, OsFs, PathKind, Vfs, VfsFile, VfsLock};
