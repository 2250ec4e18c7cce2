//! Reading history (SPEC L2) and verified replay (SPEC L3, L4).

use super::append::decode_record;
use super::digest::check_run;
use super::head::LogHead;
use super::{REPLAY_PAGE, corrupt, keys};
use crate::error::{Error, Result};
use crate::store::{Cursor, KeyRange, Partition, Store};

/// One record of an entity log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogRecord {
    /// Its sequence number (1, 2, 3 ...).
    pub seq: u64,
    /// The running digest after this record (SPEC L4).
    pub digest: u64,
    /// The application's bytes.
    pub payload: Vec<u8>,
}

/// One page of history.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogPage {
    /// Records in sequence order, consecutive.
    pub records: Vec<LogRecord>,
    /// Where the next page starts; `None` at the end of the log.
    pub next_seq: Option<u64>,
}

/// Reads at most `limit` records with `seq >= from_seq`, in order (SPEC L2).
///
/// Records before the first retained one (truncated by a retention policy) are not returned;
/// the page starts at the first retained record at or after `from_seq`. A malformed row, or a
/// gap inside the page, is reported as [`Error::Corrupt`].
pub fn read_log(store: &dyn Store, p: &Partition, from_seq: u64, limit: usize) -> Result<LogPage> {
    let page = store.scan(p, &keys::records_from(from_seq.max(1)), None, limit)?;
    let mut records = Vec::with_capacity(page.entries.len());
    for (key, value) in page.entries {
        let record = parse_row(p, &key, value)?;
        if let Some(previous) = records.last().map(|r: &LogRecord| r.seq)
            && record.seq != previous + 1
        {
            return Err(corrupt(
                p,
                format!("log record {} follows record {previous}", record.seq),
            ));
        }
        records.push(record);
    }
    let next_seq = match (&page.next, records.last()) {
        (Some(_), Some(last)) => Some(last.seq + 1),
        _ => None,
    };
    Ok(LogPage { records, next_seq })
}

/// Parses one record row, keeping the row's own bytes as the payload (its header is cut off in
/// place), so reading a record allocates nothing beyond what the store returned.
fn parse_row(p: &Partition, key: &[u8], mut value: Vec<u8>) -> Result<LogRecord> {
    let seq = keys::record_seq(key)
        .ok_or_else(|| corrupt(p, format!("malformed log key {}", key.escape_ascii())))?;
    let (digest, payload) = decode_record(p, seq, &value)?;
    let header = value.len() - payload.len();
    value.drain(..header);
    Ok(LogRecord {
        seq,
        digest,
        payload: value,
    })
}

/// Parses a page's rows up to the first malformed one. That one's error is returned beside the
/// records before it, which are still checked and visited first, as a row-by-row walk would.
fn parse_rows(p: &Partition, rows: Vec<(Vec<u8>, Vec<u8>)>) -> (Vec<LogRecord>, Result<()>) {
    let mut malformed = Ok(());
    let records = (rows.into_iter())
        .map(|(key, value)| parse_row(p, &key, value))
        .map_while(|row| row.map_err(|e| malformed = Err(e)).ok())
        .collect();
    (records, malformed)
}

/// Replays the records after `(after_seq, after_digest)` up to the head, in order, checking the
/// chain as it goes (SPEC L3, L4), and returns how many records it handed to `apply`.
///
/// Every record must be present, consecutive, and carry exactly the digest computed from its
/// predecessor; the last digest must equal the head's. Any mismatch is [`Error::Corrupt`] and
/// stops the replay before the bad record reaches `apply`. `apply`'s own error stops the replay
/// and is returned as is.
pub fn replay<E: From<Error>>(
    store: &dyn Store,
    p: &Partition,
    head: &LogHead,
    after_seq: u64,
    after_digest: u64,
    mut apply: impl FnMut(&LogRecord) -> Result<(), E>,
) -> Result<u64, E> {
    let mut replayed = 0u64;
    let end = walk(store, p, head, after_seq, after_digest, |record| {
        replayed += 1;
        apply(record)
    })?;
    if end != head.digest {
        return Err(corrupt(
            p,
            format!(
                "the log's last digest {end:016x} does not match its head {:016x}",
                head.digest
            ),
        )
        .into());
    }
    Ok(replayed)
}

/// Walks records `after_seq + 1 ..= up_to` (bounded by the head), recomputing the chain from
/// `after_digest`; returns the digest after the last record. Each stored digest must equal the
/// recomputed one.
pub(crate) fn walk_to<E: From<Error>>(
    store: &dyn Store,
    p: &Partition,
    head: &LogHead,
    after_seq: u64,
    after_digest: u64,
    up_to: u64,
    mut visit: impl FnMut(&LogRecord) -> Result<(), E>,
) -> Result<u64, E> {
    let bounded = LogHead {
        next_seq: up_to.min(head.last_seq()) + 1,
        ..*head
    };
    walk(store, p, &bounded, after_seq, after_digest, &mut visit)
}

fn walk<E: From<Error>>(
    store: &dyn Store,
    p: &Partition,
    head: &LogHead,
    after_seq: u64,
    after_digest: u64,
    mut visit: impl FnMut(&LogRecord) -> Result<(), E>,
) -> Result<u64, E> {
    if after_seq >= head.next_seq {
        return Ok(after_digest);
    }
    if after_seq + 1 < head.first_seq {
        return Err(corrupt(
            p,
            format!(
                "records after {after_seq} were truncated (the log now starts at {})",
                head.first_seq
            ),
        )
        .into());
    }
    let range: KeyRange = keys::record_range(after_seq + 1, head.next_seq);
    let mut cursor: Option<Cursor> = None;
    let mut expected = after_seq + 1;
    let mut digest = after_digest;
    loop {
        let page = store.scan(p, &range, cursor.as_ref(), REPLAY_PAGE)?;
        let (records, malformed) = parse_rows(p, page.entries);
        let run = check_run(digest, &records);
        for (i, record) in records.iter().enumerate() {
            if record.seq != expected {
                return Err(corrupt(
                    p,
                    format!("log record {expected} is missing (found {})", record.seq),
                )
                .into());
            }
            digest = run.chained(i, digest, record);
            if record.digest != digest {
                return Err(corrupt(
                    p,
                    format!(
                        "log record {} has digest {:016x}, its history gives {digest:016x}",
                        record.seq, record.digest
                    ),
                )
                .into());
            }
            visit(record)?;
            expected += 1;
        }
        malformed?;
        match page.next {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    if expected != head.next_seq {
        return Err(corrupt(p, format!("log record {expected} is missing")).into());
    }
    Ok(digest)
}
