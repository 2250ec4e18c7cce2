//! The fence's rows: their keys and their postcard encodings (SPEC F rows).
//!
//! Coordinator partition `c/<ns>`, per fence kind: the current value (absent means 0), one
//! leased-shard row per leased entity, a recovery marker and a revocation checkpoint. Entity
//! partition: the entity's lease, under a reserved key (first byte `0x00`).
//!
//! Decoding never panics: a row that does not decode is
//! [`Error::Corrupt`](crate::Error::Corrupt) and the caller stops before changing anything.

use serde::{Deserialize, Serialize};

use crate::entity::{EntityId, Namespace};
use crate::error::{Error, Result};
use crate::store::KeyRange;

/// Which of the two fences of SPEC F10 a [`Fence`](super::Fence) drives. Each kind has its own
/// rows and its own acknowledgements; they share the machinery.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FenceKind {
    /// The namespace's epoch (SPEC F1-F9).
    Epoch,
    /// The namespace's authority generation, an independent second fence (SPEC F10).
    Authority,
}

impl FenceKind {
    fn tag(self) -> &'static str {
        match self {
            FenceKind::Epoch => "epoch",
            FenceKind::Authority => "authority",
        }
    }
}

/// The keys one fence kind uses. Public with the feature `test-hooks`, so tests can damage
/// rows on purpose.
#[derive(Clone, Debug)]
pub struct Keys {
    prefix: Vec<u8>,
    lease: Vec<u8>,
}

/// The start of every fence row inside an entity partition (each kind's lease).
pub(crate) const FENCE_ROWS_PREFIX: &[u8] = b"\0fence.";

impl Keys {
    /// The keys of `kind`.
    pub fn new(kind: FenceKind) -> Self {
        let mut lease = FENCE_ROWS_PREFIX.to_vec();
        lease.extend_from_slice(format!("{}.lease", kind.tag()).as_bytes());
        Keys {
            prefix: format!("fence.{}/", kind.tag()).into_bytes(),
            lease,
        }
    }

    fn with(&self, suffix: &[u8]) -> Vec<u8> {
        let mut key = self.prefix.clone();
        key.extend_from_slice(suffix);
        key
    }

    /// Coordinator: the current epoch (or generation).
    pub fn current(&self) -> Vec<u8> {
        self.with(b"current")
    }

    /// Coordinator: the recovery marker.
    pub fn recovery(&self) -> Vec<u8> {
        self.with(b"recovery")
    }

    /// Coordinator: the revocation checkpoint.
    pub fn checkpoint(&self) -> Vec<u8> {
        self.with(b"revoke")
    }

    /// Coordinator: the declaration that the namespace is unfenced.
    pub fn unfenced(&self) -> Vec<u8> {
        self.with(b"unfenced")
    }

    /// Coordinator: the leased-shard row of `entity`.
    pub fn shard(&self, entity: &EntityId) -> Vec<u8> {
        let mut key = self.with(b"shard/");
        key.extend_from_slice(entity.id());
        key
    }

    /// Coordinator: every leased-shard row.
    pub fn shard_range(&self) -> KeyRange {
        KeyRange::prefix(&self.with(b"shard/"))
    }

    /// The entity a leased-shard key names.
    pub fn entity_of_shard(&self, ns: &Namespace, key: &[u8]) -> Result<EntityId> {
        let id = key
            .strip_prefix(self.with(b"shard/").as_slice())
            .ok_or_else(|| Error::corrupt("leased-shard row", "a key outside the shard range"))?;
        EntityId::in_namespace(ns.clone(), id)
            .map_err(|_| Error::corrupt("leased-shard row", "its key names no valid entity"))
    }

    /// Entity partition: the entity's lease (a reserved key).
    pub fn lease(&self) -> &[u8] {
        &self.lease
    }
}

/// A leased-shard row in the coordinator: the coordinator's record that an entity may hold a
/// lease, and up to which epoch that lease is known to have been pushed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardRow {
    /// The epoch the row was granted or renewed under.
    pub epoch: u64,
    /// When the lease ends, on the planner's clock.
    pub expires_at_ms: u64,
    /// The epoch the entity's lease is known (by a committed push) to carry.
    pub acked_epoch: u64,
    /// The grant this row was written for.
    pub grant_id: u128,
}

/// An entity's lease: the token its fenced writes are guarded on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRow {
    /// The epoch the lease carries.
    pub epoch: u64,
    /// When the lease ends, on the planner's clock.
    pub expires_at_ms: u64,
    /// The unique grant, so a delayed batch never commits against a later lease.
    pub grant_id: u128,
}

/// The recovery marker (SPEC F6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoveryRow {
    /// When the lease table was declared recovered, on the planner's clock.
    pub resumed_at_ms: u64,
}

/// Where a revocation resumes (SPEC F4).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ScanPosition {
    /// From the first leased-shard row.
    Start,
    /// Strictly after this key.
    After(Vec<u8>),
    /// Every row has been found complete.
    Done,
}

/// The revocation checkpoint: valid only for the same epoch and recovery marker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointRow {
    /// The epoch being revoked towards.
    pub epoch: u64,
    /// The recovery marker's `resumed_at_ms` when the checkpoint was written.
    pub recovery: Option<u64>,
    /// How far the complete prefix reaches.
    pub cursor: ScanPosition,
}

/// The first byte of every fence row: a format tag, so stray or damaged bytes are caught
/// instead of being read as a small number.
const ROW_FORMAT: u8 = 0xF1;

/// Encodes a row.
pub fn encode<T: Serialize>(row: &T) -> Vec<u8> {
    let mut out = vec![ROW_FORMAT];
    out.extend(postcard::to_allocvec(row).expect("fence rows always encode"));
    out
}

/// Decodes a row, naming it in the error if it is damaged (wrong tag, bad body, trailing bytes).
pub fn decode<'a, T: Deserialize<'a>>(what: &str, bytes: &'a [u8]) -> Result<T> {
    let body = match bytes.split_first() {
        Some((&ROW_FORMAT, body)) => body,
        _ => return Err(Error::corrupt(what, "missing fence row format tag")),
    };
    match postcard::take_from_bytes(body) {
        Ok((row, [])) => Ok(row),
        Ok(_) => Err(Error::corrupt(what, "trailing bytes after the row")),
        Err(e) => Err(Error::corrupt(what, format!("undecodable: {e}"))),
    }
}

/// Decodes an optional row.
pub fn decode_opt<'a, T: Deserialize<'a>>(
    what: &str,
    bytes: Option<&'a [u8]>,
) -> Result<Option<T>> {
    bytes.map(|b| decode(what, b)).transpose()
}

/// Decodes the current epoch row (absent means 0).
/// One leased-shard row of a scanned page, decoded: its key, its bytes as read, the row and
/// the entity it leases.
pub(crate) type ShardEntry<'a> = (&'a Vec<u8>, &'a Vec<u8>, ShardRow, EntityId);

/// Decodes a whole page of leased-shard rows before anything acts on it, so a damaged row stops
/// the caller before it changes anything for that page.
pub(crate) fn decode_shard_page<'a>(
    keys: &Keys,
    ns: &Namespace,
    entries: &'a [(Vec<u8>, Vec<u8>)],
) -> Result<Vec<ShardEntry<'a>>> {
    entries
        .iter()
        .map(|(key, raw)| {
            let row: ShardRow = decode("leased-shard row", raw)?;
            Ok((key, raw, row, keys.entity_of_shard(ns, key)?))
        })
        .collect()
}

pub fn decode_epoch(bytes: Option<&[u8]>) -> Result<u64> {
    Ok(decode_opt::<u64>("epoch row", bytes)?.unwrap_or(0))
}
