//! Reading history (SPEC L2) and verified replay (SPEC L3, L4).

use super::append::decode_record;
use super::digest::check_run;
use super::head::{LogHead, read_head};
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

/// One record of an entity log, lent by [`visit_log`] for the length of one visit: its payload
/// borrows the store's buffer instead of being copied out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LogRecordRef<'a> {
    /// Its sequence number (1, 2, 3 ...).
    pub seq: u64,
    /// The running digest after this record (SPEC L4).
    pub digest: u64,
    /// The application's bytes.
    pub payload: &'a [u8],
}

impl From<LogRecordRef<'_>> for LogRecord {
    fn from(r: LogRecordRef<'_>) -> LogRecord {
        LogRecord {
            seq: r.seq,
            digest: r.digest,
            payload: r.payload.to_vec(),
        }
    }
}

/// Reads at most `limit` records with `seq >= from_seq`, in order (SPEC L2).
///
/// Records before the first retained one (truncated by a retention policy) are not returned;
/// the page starts at the first retained record at or after `from_seq`. A malformed row, or a
/// missing record followed by a later one (a gap inside the page, or at its start: the page's
/// first record is not `from_seq`, nor the first retained one when `from_seq` is before it), is
/// reported as [`Error::Corrupt`], so paging never steps over a gap at a page boundary. The
/// head row is read only when the page does not start at `from_seq`. Records missing at the
/// very end of the log are not seen here ([`replay`] checks the log against its head).
/// [`visit_log`] reads the same page without copying each payload out.
///
/// # Examples
///
/// ```
/// use portcullis::log;
/// use portcullis::store::{Batch, MemoryStore, Partition};
///
/// # fn main() -> portcullis::Result<()> {
/// let store = MemoryStore::new();
/// let p = Partition::new("e/chat/room-1")?;
/// log::append(&store, &p, &[b"a".to_vec(), b"b".to_vec(), b"c".to_vec()], Batch::new())?;
/// let page = log::read_log(&store, &p, 1, 2)?;
/// assert_eq!(page.records[1].payload, b"b");
/// assert_eq!(page.next_seq, Some(3));
/// let rest = log::read_log(&store, &p, 3, 2)?;
/// assert_eq!((rest.records.len(), rest.next_seq), (1, None));
/// # Ok(())
/// # }
/// ```
pub fn read_log(store: &dyn Store, p: &Partition, from_seq: u64, limit: usize) -> Result<LogPage> {
    let mut records: Vec<LogRecord> = Vec::with_capacity(limit.min(REPLAY_PAGE));
    let next_seq = visit_log(store, p, from_seq, limit, |r| {
        records.push(r.into());
        Ok::<(), Error>(())
    })?;
    Ok(LogPage { records, next_seq })
}

/// Reads the page [`read_log`] would (SPEC L2), lending each record to `visit` in order instead
/// of copying it out, and returns where the next page starts (`None` at the end of the log).
///
/// The same rules as [`read_log`]: at most `limit` records with `seq >= from_seq`, starting at
/// the first retained one; a malformed row, or a gap inside the page or at its start, is
/// [`Error::Corrupt`], reported before `visit` sees the record after it. The payload is borrowed from the store's buffer
/// for the length of the call only; copy what must outlive it. `visit`'s own error stops the
/// read and is returned as is.
///
/// # Examples
///
/// ```
/// use portcullis::log;
/// use portcullis::store::{Batch, MemoryStore, Partition};
///
/// # fn main() -> portcullis::Result<()> {
/// let store = MemoryStore::new();
/// let p = Partition::new("e/chat/room-1")?;
/// log::append(&store, &p, &[b"hello".to_vec(), b"world".to_vec(), b"!".to_vec()], Batch::new())?;
/// let (mut bytes, mut from) = (0, Some(1));
/// while let Some(seq) = from {
///     from = log::visit_log(&store, &p, seq, 2, |record| {
///         bytes += record.payload.len();
///         Ok::<(), portcullis::Error>(())
///     })?;
/// }
/// assert_eq!(bytes, 11);
/// # Ok(())
/// # }
/// ```
pub fn visit_log<E: From<Error>>(
    store: &dyn Store,
    p: &Partition,
    from_seq: u64,
    limit: usize,
    mut visit: impl FnMut(LogRecordRef<'_>) -> Result<(), E>,
) -> Result<Option<u64>, E> {
    let mut from = from_seq.max(1);
    loop {
        match visit_page(store, p, from, limit, &mut visit)? {
            Page::Read(next) => return Ok(next),
            // The first record found is past `from`: only a truncated prefix may explain that
            // (the head is read only then, so a read at a retained record costs nothing more).
            // Truncation only moves the head's first record forward, so a head read after the
            // scan tells whether the records the scan skipped were truncated by then.
            Page::StartsAt(found) => {
                let first = read_head(store, p)?.head.first_seq;
                if first <= from || found > first {
                    let missing = from.max(first);
                    return Err(corrupt(
                        p,
                        format!("log record {missing} is missing (found {found})"),
                    )
                    .into());
                }
                from = first;
            }
        }
    }
}

/// What one scan of [`visit_page`] found.
enum Page {
    /// The page was read and visited; where the next page starts.
    Read(Option<u64>),
    /// The first record found is this one, after the page's start: nothing was visited.
    StartsAt(u64),
}

/// Reads one page from `from` (see [`visit_log`]): every record must follow the one before it,
/// the first must be `from` itself.
fn visit_page<E: From<Error>>(
    store: &dyn Store,
    p: &Partition,
    from: u64,
    limit: usize,
    visit: &mut impl FnMut(LogRecordRef<'_>) -> Result<(), E>,
) -> Result<Page, E> {
    let mut last: Option<u64> = None;
    let mut starts_at: Option<u64> = None;
    // The visitor's own error, kept aside while the store is told only to stop.
    let mut stopped: Option<E> = None;
    let next = store.scan_visit(
        p,
        &keys::records_from(from),
        None,
        limit,
        &mut |key, value| {
            let (seq, digest, payload) = parse_row(p, key, value)?;
            match last {
                Some(previous) if seq != previous + 1 => {
                    return Err(corrupt(
                        p,
                        format!("log record {seq} follows record {previous}"),
                    ));
                }
                None if seq != from => {
                    starts_at = Some(seq);
                    return Err(Error::invalid("the log read starts after its first record"));
                }
                _ => {}
            }
            last = Some(seq);
            visit(LogRecordRef {
                seq,
                digest,
                payload,
            })
            .map_err(|e| {
                stopped = Some(e);
                Error::invalid("the visitor stopped the log read")
            })
        },
    );
    if let Some(e) = stopped {
        return Err(e);
    }
    if let Some(seq) = starts_at {
        return Ok(Page::StartsAt(seq));
    }
    Ok(Page::Read(match (next?, last) {
        (Some(_), Some(last)) => Some(last + 1),
        _ => None,
    }))
}

/// Parses one record row into its sequence number, its digest and its payload (borrowed from
/// the row).
fn parse_row<'v>(p: &Partition, key: &[u8], value: &'v [u8]) -> Result<(u64, u64, &'v [u8])> {
    let seq = keys::record_seq(key)
        .ok_or_else(|| corrupt(p, format!("malformed log key {}", key.escape_ascii())))?;
    let (digest, payload) = decode_record(p, seq, value)?;
    Ok((seq, digest, payload))
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
    // A page's records, their payload buffers reused from page to page: rows are lent by the
    // store only inside `scan_visit`, and the digest check wants the whole page at once.
    let mut page: Vec<LogRecord> = Vec::new();
    loop {
        let mut filled = 0;
        // A malformed row ends the page; the records before it are still checked and visited
        // first, as a row-by-row walk would.
        let mut malformed: Option<Error> = None;
        let next = store.scan_visit(
            p,
            &range,
            cursor.as_ref(),
            REPLAY_PAGE,
            &mut |key, value| {
                let (seq, stored, payload) = match parse_row(p, key, value) {
                    Ok(row) => row,
                    Err(e) => {
                        malformed = Some(e);
                        return Err(Error::invalid("replay stopped at a malformed row"));
                    }
                };
                if filled == page.len() {
                    page.push(LogRecord {
                        seq: 0,
                        digest: 0,
                        payload: Vec::new(),
                    });
                }
                let record = &mut page[filled];
                record.seq = seq;
                record.digest = stored;
                record.payload.clear();
                record.payload.extend_from_slice(payload);
                filled += 1;
                Ok(())
            },
        );
        let next = match (next, &malformed) {
            (_, Some(_)) => None,
            (next, None) => next?,
        };
        let records = &page[..filled];
        let run = check_run(digest, records);
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
        if let Some(e) = malformed {
            return Err(e.into());
        }
        match next {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    if expected != head.next_seq {
        return Err(corrupt(p, format!("log record {expected} is missing")).into());
    }
    Ok(digest)
}
