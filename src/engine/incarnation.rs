//! Incarnations: each open-to-close lifetime of an engine gets the next number of its owner id,
//! recorded durably at open, and a clean shutdown is recorded at close. Several engines (owners)
//! can share one store: each owner id has its own row, so no engine mistakes another's open
//! incarnation for a crash (SPEC F11).
//!
//! Repairs after an unclean end (SPEC R3) are owed per namespace, in its owner row (see
//! `owner`): the incarnation row only says whether this owner's previous incarnation ended
//! cleanly, for telemetry.
//!
//! Next to it, the owner's lease row (SPEC F12) says until when the running incarnation is
//! live: it is written at open and renewed while the engine runs (`liveness`), deleted at a
//! clean close. An engine opening with the owner id of a live incarnation (its lease not yet
//! expired) is refused with [`Error::OwnerLive`], never taking it for a crash; once the lease
//! has expired, the incarnation is taken for crashed. The lease names the store handle it was
//! written through: on a store whose handle holds the data alone
//! ([`Store::exclusive_handle`], the file store's directory lock) a lease written through
//! another handle was written by an engine whose store has been closed (or whose process
//! ended), so its incarnation is taken for crashed at once.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::log::{decode_row, encode_row};
use crate::store::{Batch, Outcome, Partition, Store};

/// The reserved system partition the engine keeps its own rows in.
pub(crate) const SYSTEM_PARTITION: &str = "s/engine";

/// The owner id an engine serves as unless told otherwise.
pub(crate) const DEFAULT_OWNER: &str = "default";

/// How many lost races over the incarnation rows an open tolerates.
const BEGIN_ATTEMPTS: usize = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct IncarnationRow {
    number: u64,
    clean: bool,
    /// No longer written (repairs are owed per namespace); kept so older rows decode.
    owed_repair: Option<u64>,
}

/// An owner's lease (SPEC F12): its incarnation `incarnation` is live until `expires_at_ms`
/// on the clock of whoever reads it (skew below the fence's lease margin). `handle` names the
/// store handle it was written through ([`Store::exclusive_handle`]; 0 if the store has none).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LeaseRow {
    pub(crate) incarnation: u64,
    pub(crate) expires_at_ms: u64,
    pub(crate) handle: u64,
}

impl LeaseRow {
    /// Whether this lease keeps its incarnation live at `now_ms`, read through a store handle
    /// numbered `reader` (if it holds the data alone): a lease written through another such
    /// handle vouches for nothing, since that handle has been closed (or its process ended).
    pub(crate) fn live_at(&self, now_ms: u64, reader: Option<u64>) -> bool {
        let other_handle = self.handle != 0 && reader.is_some_and(|h| h != self.handle);
        now_ms < self.expires_at_ms && !other_handle
    }
}

/// This engine's incarnation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Incarnation {
    pub(crate) number: u64,
    pub(crate) unclean_previous: Option<u64>,
    pub(crate) key: Vec<u8>,
    pub(crate) written: Vec<u8>,
    /// The owner's lease row key.
    pub(crate) lease_key: Vec<u8>,
}

pub(crate) fn system_partition() -> Partition {
    Partition::new(SYSTEM_PARTITION).expect("a valid partition name")
}

/// The incarnation row's key of an owner; the default owner keeps the historical key.
fn key_of(owner: &str) -> Vec<u8> {
    if owner == DEFAULT_OWNER {
        b"incarnation".to_vec()
    } else {
        format!("incarnation/{owner}").into_bytes()
    }
}

/// The lease row's key of an owner.
pub(crate) fn lease_key_of(owner: &str) -> Vec<u8> {
    format!("owner.lease/{owner}").into_bytes()
}

/// An owner's rows as one read found them (SPEC F12).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct OwnerRows {
    /// The number of its last incarnation, if it ever opened.
    pub(crate) incarnation: Option<u64>,
    /// Its lease row, if one is written.
    pub(crate) lease: Option<LeaseRow>,
}

/// An owner's incarnation row and lease, in one store read.
pub(crate) fn read_owner(store: &dyn Store, owner: &str) -> Result<OwnerRows> {
    let p = system_partition();
    let read = store.get_many(&p, &[&key_of(owner), &lease_key_of(owner)])?;
    let row: Option<IncarnationRow> = match &read[0] {
        Some(bytes) => Some(decode_row(&p, "incarnation", bytes)?),
        None => None,
    };
    let lease: Option<LeaseRow> = match &read[1] {
        Some(bytes) => Some(decode_row(&p, "owner lease", bytes)?),
        None => None,
    };
    Ok(OwnerRows {
        incarnation: row.map(|r| r.number),
        lease,
    })
}

/// Checks an owner id: 1..=64 bytes of `[a-z0-9._-]`, like a namespace name.
pub(crate) fn check_owner(owner: &str) -> Result<()> {
    let ok = !owner.is_empty()
        && owner.len() <= 64
        && owner
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "owner id {owner:?} must be 1 to 64 bytes of [a-z0-9._-]"
        )))
    }
}

/// Records the next incarnation of `owner` as running (not clean) with a lease until
/// `now_ms + lease_ms`, guarded on the incarnation and lease rows as read. Refused with
/// [`Error::OwnerLive`] while the previous incarnation's lease is live (see
/// [`LeaseRow::live_at`]), unless `take_none_for_live` (a test's negative control).
pub(crate) fn begin(
    store: &dyn Store,
    owner: &str,
    (now_ms, lease_ms): (u64, u64),
    take_none_for_live: bool,
) -> Result<Incarnation> {
    let handle = store.exclusive_handle();
    let p = system_partition();
    let key = key_of(owner);
    let lease_key = lease_key_of(owner);
    for _ in 0..BEGIN_ATTEMPTS {
        let read = store.get_many(&p, &[&key, &lease_key])?;
        let previous: Option<IncarnationRow> = match &read[0] {
            Some(bytes) => Some(decode_row(&p, "incarnation", bytes)?),
            None => None,
        };
        let lease: Option<LeaseRow> = match &read[1] {
            Some(bytes) => Some(decode_row(&p, "owner lease", bytes)?),
            None => None,
        };
        if let (Some(prev), Some(lease)) = (previous, lease)
            && !prev.clean
            && lease.incarnation == prev.number
            && !take_none_for_live
            && lease.live_at(now_ms, handle)
        {
            return Err(Error::OwnerLive {
                owner: owner.to_string(),
                incarnation: prev.number,
                expires_in_ms: lease.expires_at_ms - now_ms,
                detail: format!(
                    "another engine with owner id {owner:?} is open on this store; close it, or \
                     give this engine an owner id of its own (EngineBuilder::owner), or, if that \
                     engine's process is gone, open again once its lease has expired (in {} ms)",
                    lease.expires_at_ms - now_ms
                ),
            });
        }
        let number = previous.map_or(0, |r| r.number) + 1;
        let unclean_previous = previous.filter(|r| !r.clean).map(|r| r.number);
        let written = encode_row(&IncarnationRow {
            number,
            clean: false,
            owed_repair: None,
        });
        let lease_row = encode_row(&LeaseRow {
            incarnation: number,
            expires_at_ms: now_ms.saturating_add(lease_ms),
            handle: handle.unwrap_or(0),
        });
        let mut batch = Batch::new();
        for (k, raw) in [(&key, &read[0]), (&lease_key, &read[1])] {
            batch = match raw {
                Some(bytes) => batch.equals(k.clone(), bytes.clone()),
                None => batch.absent(k.clone()),
            };
        }
        let batch = batch
            .put(key.clone(), written.clone())
            .put(lease_key.clone(), lease_row);
        if store.apply(&p, &batch)? != Outcome::Committed {
            continue; // another open of this owner id raced this one: look again
        }
        match unclean_previous {
            Some(prev) => ::log::warn!(
                "owner {owner:?} incarnation {number} begins; incarnation {prev} ended without a \
                 clean shutdown (its lease expired)"
            ),
            None => ::log::info!("owner {owner:?} incarnation {number} begins"),
        }
        return Ok(Incarnation {
            number,
            unclean_previous,
            key,
            written,
            lease_key,
        });
    }
    Err(Error::Unavailable {
        reason: format!(
            "other engines with owner id {owner:?} kept opening this store at the same time"
        ),
        retry_after_ms: 100,
    })
}

/// Records a clean shutdown of `incarnation` and ends its lease.
pub(crate) fn end_clean(store: &dyn Store, incarnation: &Incarnation) -> Result<()> {
    let p = system_partition();
    let clean = encode_row(&IncarnationRow {
        number: incarnation.number,
        clean: true,
        owed_repair: None,
    });
    let batch = Batch::new()
        .equals(incarnation.key.clone(), incarnation.written.clone())
        .put(incarnation.key.clone(), clean)
        .delete(incarnation.lease_key.clone());
    match store.apply(&p, &batch)? {
        Outcome::Committed => {
            ::log::info!("incarnation {} closed cleanly", incarnation.number);
            Ok(())
        }
        other => Err(Error::Unavailable {
            reason: format!(
                "the incarnation row changed under incarnation {} ({other:?}); not marked clean",
                incarnation.number
            ),
            retry_after_ms: 0,
        }),
    }
}

/// The incarnation rows in an operator's words, for the inspect tool (SPEC E5): per owner id,
/// the last incarnation and whether it closed cleanly. Repairs owed are per namespace (the
/// namespace's owner row).
pub(crate) fn describe(store: &dyn Store) -> Result<Option<String>> {
    let p = system_partition();
    let page = store.scan(
        &p,
        &crate::store::KeyRange::prefix(b"incarnation"),
        None,
        1_000,
    )?;
    let mut lines = Vec::new();
    for (key, raw) in page.entries {
        let owner = match key.strip_prefix(b"incarnation/".as_slice()) {
            Some(name) => String::from_utf8_lossy(name).into_owned(),
            None if key == b"incarnation" => DEFAULT_OWNER.to_string(),
            None => continue,
        };
        let row: IncarnationRow = decode_row(&p, "incarnation", &raw)?;
        let state = if row.clean {
            "closed cleanly".to_string()
        } else {
            // Its owner lease says until when it counts as running (SPEC F12).
            let lease = match store.get(&p, &lease_key_of(&owner))? {
                Some(bytes) => Some(decode_row::<LeaseRow>(&p, "owner lease", &bytes)?),
                None => None,
            };
            match lease.filter(|l| l.incarnation == row.number) {
                Some(l) => format!(
                    "did not close cleanly (running now, or it crashed): its owner lease runs \
                     until {} ms",
                    l.expires_at_ms
                ),
                None => {
                    "did not close cleanly (it crashed, or a release without owner leases runs it)"
                        .to_string()
                }
            }
        };
        lines.push(format!(
            "owner {owner:?}: incarnation {} {state}",
            row.number
        ));
    }
    if lines.is_empty() {
        return Ok(None);
    }
    Ok(Some(lines.join("; ")))
}
