//! Incarnations: each open-to-close lifetime of a store gets the next number, recorded durably
//! at open, and a clean shutdown is recorded at close. An open that finds the previous
//! incarnation not marked clean knows it ended uncleanly, and restore runs the repair (SPEC R3).
//!
//! A repair is owed to every entity, but an incarnation may close before it has restored them
//! all. So a clean close records which unclean incarnation is still owed a repair (unless every
//! entity was restored), and the next incarnation carries the obligation forward: a repair is
//! never lost because the incarnation after a crash closed early.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::log::{decode_row, encode_row};
use crate::store::{Batch, Outcome, Partition, Store};

/// The reserved system partition the engine keeps its own rows in.
pub(crate) const SYSTEM_PARTITION: &str = "s/engine";
const INCARNATION_KEY: &[u8] = b"incarnation";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct IncarnationRow {
    number: u64,
    clean: bool,
    /// The unclean incarnation some entity may still need a repair for.
    owed_repair: Option<u64>,
}

/// This process's incarnation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Incarnation {
    pub(crate) number: u64,
    pub(crate) unclean_previous: Option<u64>,
    written: Vec<u8>,
}

fn system_partition() -> Partition {
    Partition::new(SYSTEM_PARTITION).expect("a valid partition name")
}

/// Records the next incarnation as running (not clean), guarded on the row as read.
pub(crate) fn begin(store: &dyn Store) -> Result<Incarnation> {
    let p = system_partition();
    let raw = store.get(&p, INCARNATION_KEY)?;
    let previous: Option<IncarnationRow> = match &raw {
        Some(bytes) => Some(decode_row(&p, "incarnation", bytes)?),
        None => None,
    };
    let number = previous.map_or(0, |r| r.number) + 1;
    let unclean_previous = previous.and_then(|r| {
        if r.clean {
            r.owed_repair
        } else {
            Some(r.number)
        }
    });
    // Until this incarnation closes cleanly, a crash makes it the one owed a repair.
    let written = encode_row(&IncarnationRow {
        number,
        clean: false,
        owed_repair: unclean_previous,
    });
    let guard = match raw {
        Some(bytes) => Batch::new().equals(INCARNATION_KEY.to_vec(), bytes),
        None => Batch::new().absent(INCARNATION_KEY.to_vec()),
    };
    let batch = guard.put(INCARNATION_KEY.to_vec(), written.clone());
    match store.apply(&p, &batch)? {
        Outcome::Committed => {}
        other => {
            return Err(Error::Unavailable {
                reason: format!("another engine opened this store at the same time ({other:?})"),
                retry_after_ms: 100,
            });
        }
    }
    match unclean_previous {
        Some(prev) => ::log::warn!(
            "incarnation {number} begins; incarnation {prev} ended without a clean shutdown, entities will be repaired as they restore"
        ),
        None => ::log::info!("incarnation {number} begins"),
    }
    Ok(Incarnation {
        number,
        unclean_previous,
        written,
    })
}

/// Records a clean shutdown of `incarnation`. `all_restored` says whether every entity was
/// restored in it (and so got any repair it was owed).
pub(crate) fn end_clean(
    store: &dyn Store,
    incarnation: &Incarnation,
    all_restored: bool,
) -> Result<()> {
    let p = system_partition();
    let owed_repair = if all_restored {
        None
    } else {
        incarnation.unclean_previous
    };
    if let Some(owed) = owed_repair {
        ::log::info!("not every entity was restored; the repair for incarnation {owed} stays owed");
    }
    let clean = encode_row(&IncarnationRow {
        number: incarnation.number,
        clean: true,
        owed_repair,
    });
    let batch = Batch::new()
        .equals(INCARNATION_KEY.to_vec(), incarnation.written.clone())
        .put(INCARNATION_KEY.to_vec(), clean);
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

/// The incarnation row in an operator's words, for the inspect tool (SPEC E5): the last
/// incarnation, whether it closed cleanly, and which unclean one is still owed a repair.
pub(crate) fn describe(store: &dyn Store) -> Result<Option<String>> {
    let p = system_partition();
    let Some(raw) = store.get(&p, INCARNATION_KEY)? else {
        return Ok(None);
    };
    let row: IncarnationRow = decode_row(&p, "incarnation", &raw)?;
    let state = if row.clean {
        "closed cleanly"
    } else {
        "did not close cleanly (running now, or it crashed)"
    };
    let owed = match (row.clean, row.owed_repair) {
        (false, _) => format!(
            "the next open repairs entities for incarnation {}",
            row.number
        ),
        (true, Some(owed)) => {
            format!("entities not yet restored owe a repair for incarnation {owed}")
        }
        (true, None) => "no repair owed".to_string(),
    };
    Ok(Some(format!("incarnation {} {state}; {owed}", row.number)))
}
