//! Incarnations: each open-to-close lifetime of an engine gets the next number of its owner id,
//! recorded durably at open, and a clean shutdown is recorded at close. Several engines (owners)
//! can share one store: each owner id has its own row, so no engine mistakes another's open
//! incarnation for a crash (SPEC F11).
//!
//! Repairs after an unclean end (SPEC R3) are owed per namespace, in its owner row (see
//! `owner`): the incarnation row only says whether this owner's previous incarnation ended
//! cleanly, for telemetry.
//!
//! Owner ids must be unique among live engines sharing a store (documented, not checked: an
//! engine opening with the id of a live one would take its open incarnation for a crash).

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::log::{decode_row, encode_row};
use crate::store::{Batch, Outcome, Partition, Store};

/// The reserved system partition the engine keeps its own rows in.
pub(crate) const SYSTEM_PARTITION: &str = "s/engine";

/// The owner id an engine serves as unless told otherwise.
pub(crate) const DEFAULT_OWNER: &str = "default";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct IncarnationRow {
    number: u64,
    clean: bool,
    /// No longer written (repairs are owed per namespace); kept so older rows decode.
    owed_repair: Option<u64>,
}

/// This engine's incarnation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Incarnation {
    pub(crate) number: u64,
    pub(crate) unclean_previous: Option<u64>,
    key: Vec<u8>,
    written: Vec<u8>,
}

fn system_partition() -> Partition {
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

/// Records the next incarnation of `owner` as running (not clean), guarded on the row as read.
pub(crate) fn begin(store: &dyn Store, owner: &str) -> Result<Incarnation> {
    let p = system_partition();
    let key = key_of(owner);
    let raw = store.get(&p, &key)?;
    let previous: Option<IncarnationRow> = match &raw {
        Some(bytes) => Some(decode_row(&p, "incarnation", bytes)?),
        None => None,
    };
    let number = previous.map_or(0, |r| r.number) + 1;
    let unclean_previous = previous.filter(|r| !r.clean).map(|r| r.number);
    let written = encode_row(&IncarnationRow {
        number,
        clean: false,
        owed_repair: None,
    });
    let guard = match raw {
        Some(bytes) => Batch::new().equals(key.clone(), bytes),
        None => Batch::new().absent(key.clone()),
    };
    let batch = guard.put(key.clone(), written.clone());
    match store.apply(&p, &batch)? {
        Outcome::Committed => {}
        other => {
            return Err(Error::Unavailable {
                reason: format!(
                    "another engine with owner id {owner:?} opened this store at the same time ({other:?})"
                ),
                retry_after_ms: 100,
            });
        }
    }
    match unclean_previous {
        Some(prev) => ::log::warn!(
            "owner {owner:?} incarnation {number} begins; incarnation {prev} ended without a clean shutdown"
        ),
        None => ::log::info!("owner {owner:?} incarnation {number} begins"),
    }
    Ok(Incarnation {
        number,
        unclean_previous,
        key,
        written,
    })
}

/// Records a clean shutdown of `incarnation`.
pub(crate) fn end_clean(store: &dyn Store, incarnation: &Incarnation) -> Result<()> {
    let p = system_partition();
    let clean = encode_row(&IncarnationRow {
        number: incarnation.number,
        clean: true,
        owed_repair: None,
    });
    let batch = Batch::new()
        .equals(incarnation.key.clone(), incarnation.written.clone())
        .put(incarnation.key.clone(), clean);
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
            "closed cleanly"
        } else {
            "did not close cleanly (running now, or it crashed)"
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
