//! Entity logs and checkpoints (SPEC L1-L4), run against every store backend.

mod common;

use std::sync::Arc;

use common::backends::{Backend, each_backend};
use portcullis::Error;
use portcullis::log::{
    self, Checkpoint, GENESIS_DIGEST, Guarded, MAX_RECORD_BYTES, chain_digest, keys,
};
use portcullis::store::{Batch, KeyRange, Outcome, Partition, Store};

fn part(name: &str) -> Partition {
    Partition::new(format!("e/test/{name}")).unwrap()
}

fn append_n(store: &dyn Store, p: &Partition, n: usize) {
    let records: Vec<Vec<u8>> = (0..n).map(|i| format!("r{i}").into_bytes()).collect();
    log::append(store, p, &records, Batch::new())
        .unwrap()
        .committed()
        .unwrap();
}

fn all_records(store: &dyn Store, p: &Partition) -> Vec<log::LogRecord> {
    let mut out = Vec::new();
    let mut from = 1;
    loop {
        let page = log::read_log(store, p, from, 7).unwrap();
        out.extend(page.records);
        match page.next_seq {
            Some(next) => from = next,
            None => return out,
        }
    }
}

#[test]
fn l1_sequence_numbers_are_consecutive_from_one() {
    each_backend(|b: &Backend| {
        let s = &*b.store;
        let p = part("seq");
        let a = log::append(s, &p, &[b"a".to_vec()], Batch::new())
            .unwrap()
            .committed()
            .unwrap();
        assert_eq!((a.first_seq, a.last_seq), (1, 1), "{}", b.name);
        let a = log::append(s, &p, &[b"b".to_vec(), b"c".to_vec()], Batch::new())
            .unwrap()
            .committed()
            .unwrap();
        assert_eq!((a.first_seq, a.last_seq), (2, 3));
        let head = log::read_head(s, &p).unwrap().head;
        assert_eq!((head.first_seq, head.next_seq), (1, 4));
        let seqs: Vec<u64> = all_records(s, &p).iter().map(|r| r.seq).collect();
        assert_eq!(seqs, vec![1, 2, 3]);
    });
}

#[test]
fn l1_extra_rows_commit_with_the_records_or_not_at_all() {
    each_backend(|b| {
        let s = &*b.store;
        let p = part("extra");
        let extra = Batch::new()
            .absent(b"app".to_vec())
            .put(b"app".to_vec(), b"1".to_vec());
        let a = log::append(s, &p, &[b"x".to_vec()], extra.clone()).unwrap();
        assert!(a.committed().is_some(), "{}", b.name);
        assert_eq!(s.get(&p, b"app").unwrap(), Some(b"1".to_vec()));
        // Same guard again fails: index counts the caller's guards only, nothing changes.
        let refused = log::append(s, &p, &[b"y".to_vec()], extra).unwrap();
        assert_eq!(
            refused,
            Guarded::Refused(Outcome::PreconditionFailed { index: 0 })
        );
        assert_eq!(log::read_head(s, &p).unwrap().head.next_seq, 2);
        assert_eq!(all_records(s, &p).len(), 1);
    });
}

#[test]
fn l1_stale_head_is_refused_and_changes_nothing() {
    each_backend(|b| {
        let s = &*b.store;
        let p = part("stale");
        let stale = log::read_head(s, &p).unwrap();
        append_n(s, &p, 2);
        let moved = log::append_at(s, &p, &stale, &[b"late".to_vec()], Batch::new()).unwrap();
        assert_eq!(moved, Guarded::HeadMoved, "{}", b.name);
        assert_eq!(all_records(s, &p).len(), 2);
        // The head returned by a commit guards the next append without re-reading.
        let fresh = log::read_head(s, &p).unwrap();
        let a = log::append_at(s, &p, &fresh, &[b"n".to_vec()], Batch::new())
            .unwrap()
            .committed()
            .unwrap();
        let b2 = log::append_at(s, &p, &a.head, &[b"m".to_vec()], Batch::new()).unwrap();
        assert_eq!(b2.committed().unwrap().last_seq, 4);
    });
}

#[test]
fn l1_bad_input_is_refused_and_changes_nothing() {
    each_backend(|b| {
        let s = &*b.store;
        let p = part("bad");
        let big = vec![0u8; MAX_RECORD_BYTES + 1];
        let err = log::append(s, &p, &[big], Batch::new()).unwrap_err();
        assert!(
            matches!(err, Error::TooLarge { what: "record", .. }),
            "{}: {err}",
            b.name
        );
        let err = log::append(
            s,
            &p,
            &[b"x".to_vec()],
            Batch::new().put(keys::head_key(), b"".to_vec()),
        )
        .unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)));
        let err = log::append(
            s,
            &p,
            &[b"x".to_vec()],
            Batch::new().delete_range(KeyRange::all()),
        )
        .unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)));
        // Application rows outside the reserved prefix are fine, even a range of them.
        log::append(
            s,
            &p,
            &[b"x".to_vec()],
            Batch::new().delete_range(KeyRange::prefix(b"a")),
        )
        .unwrap()
        .committed()
        .unwrap();
        assert_eq!(log::read_head(s, &p).unwrap().head.next_seq, 2);
    });
}

#[test]
fn l1_concurrent_appenders_never_share_a_sequence_number() {
    each_backend(|b| {
        let p = part("race");
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let store = Arc::clone(&b.store);
                let p = p.clone();
                std::thread::spawn(move || {
                    for i in 0..20 {
                        let rec = format!("{t}-{i}").into_bytes();
                        // Under heavy contention `append` may give up (bounded retries); the
                        // caller retries, as the error asks.
                        loop {
                            match log::append(&*store, &p, std::slice::from_ref(&rec), Batch::new())
                            {
                                Ok(done) => break assert!(done.committed().is_some()),
                                Err(Error::Unavailable { .. }) => continue,
                                Err(e) => panic!("{e}"),
                            }
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let records = all_records(&*b.store, &p);
        assert_eq!(records.len(), 160, "{}", b.name);
        let head = log::read_head(&*b.store, &p).unwrap().head;
        let replayed =
            log::replay::<Error>(&*b.store, &p, &head, 0, GENESIS_DIGEST, |_| Ok(())).unwrap();
        assert_eq!(replayed, 160);
    });
}

#[test]
fn l2_read_log_pages_from_any_sequence_number() {
    each_backend(|b| {
        let s = &*b.store;
        let p = part("pages");
        append_n(s, &p, 300);
        let page = log::read_log(s, &p, 295, 3).unwrap();
        let seqs: Vec<u64> = page.records.iter().map(|r| r.seq).collect();
        assert_eq!(seqs, vec![295, 296, 297], "{}", b.name);
        assert_eq!(page.next_seq, Some(298));
        let last = log::read_log(s, &p, 298, 3).unwrap();
        assert_eq!(last.records.len(), 3);
        assert_eq!(last.next_seq, None);
        assert!(log::read_log(s, &p, 301, 3).unwrap().records.is_empty());
        assert_eq!(all_records(s, &p).len(), 300);
        assert_eq!(all_records(s, &p)[299].payload, b"r299");
        assert!(log::read_log(s, &p, 1, 0).is_err());
    });
}

/// Every record `visit_log` lends for one page, copied, and where it says the next page starts.
fn visited(
    store: &dyn Store,
    p: &Partition,
    from: u64,
    limit: usize,
) -> Result<(Vec<log::LogRecord>, Option<u64>), Error> {
    let mut records = Vec::new();
    let next = log::visit_log(store, p, from, limit, |r| {
        records.push(log::LogRecord {
            seq: r.seq,
            digest: r.digest,
            payload: r.payload.to_vec(),
        });
        Ok::<(), Error>(())
    })?;
    Ok((records, next))
}

/// The lending read and the copying one answer the same pages, wherever a page starts and
/// however long it is (SPEC L2).
#[test]
fn l2_visit_log_lends_exactly_the_pages_read_log_copies() {
    each_backend(|b| {
        let s = &*b.store;
        let p = part("lend");
        append_n(s, &p, 300);
        for from in [0, 1, 2, 7, 255, 256, 257, 298, 300, 301, 1_000] {
            for limit in [1, 3, 7, 256, 257, 1_024] {
                let page = log::read_log(s, &p, from, limit).unwrap();
                let (records, next) = visited(s, &p, from, limit).unwrap();
                assert_eq!(records, page.records, "{}: from {from}, {limit}", b.name);
                assert_eq!(next, page.next_seq, "{}: from {from}, {limit}", b.name);
            }
        }
        // Paging with the lending read alone visits the whole log once, in order.
        let (mut seen, mut from) = (Vec::new(), Some(1));
        while let Some(seq) = from {
            from = log::visit_log(s, &p, seq, 64, |r| {
                seen.push((r.seq, r.payload.to_vec()));
                Ok::<(), Error>(())
            })
            .unwrap();
        }
        assert_eq!(seen.len(), 300, "{}", b.name);
        assert!(seen.iter().enumerate().all(|(i, (seq, payload))| {
            *seq == i as u64 + 1 && *payload == format!("r{i}").into_bytes()
        }));
        assert!(visited(s, &p, 1, 0).is_err(), "a zero limit is refused");
    });
}

/// After truncation the lending read starts at the first retained record, as `read_log` does.
#[test]
fn l2_visit_log_starts_a_truncated_log_at_its_first_retained_record() {
    each_backend(|b| {
        let s = &*b.store;
        let p = part("lend-trunc");
        append_n(s, &p, 20);
        let head = log::read_head(s, &p).unwrap();
        let head = log::write_checkpoint(s, &p, &head, 15, b"s".to_vec(), Batch::new())
            .unwrap()
            .committed()
            .unwrap();
        log::truncate_before(s, &p, &head, 16)
            .unwrap()
            .committed()
            .unwrap();
        for (from, limit) in [(1, 100), (1, 2), (10, 3), (16, 1), (19, 5)] {
            let (records, next) = visited(s, &p, from, limit).unwrap();
            let page = log::read_log(s, &p, from, limit).unwrap();
            assert_eq!(
                (&records, next),
                (&page.records, page.next_seq),
                "{}",
                b.name
            );
        }
        let (records, next) = visited(s, &p, 1, 100).unwrap();
        let seqs: Vec<u64> = records.iter().map(|r| r.seq).collect();
        assert_eq!((seqs, next), ((16..=20).collect(), None), "{}", b.name);
    });
}

/// A gap or a malformed row inside a page is `Corrupt`, reported before the visitor sees the
/// record after it, exactly as `read_log` reports it (SPEC L2); the visitor's own error stops
/// the read and comes back as is.
#[test]
fn l2_visit_log_reports_a_gap_or_a_malformed_row_as_corrupt() {
    each_backend(|b| {
        let s = &*b.store;
        for (damage, want) in [
            ("missing", "log record 6 follows record 4"),
            ("truncated", "log record 5 is truncated"),
        ] {
            let p = part(&format!("lend-{damage}"));
            append_n(s, &p, 10);
            let batch = match damage {
                "missing" => Batch::new().delete(keys::record_key(5)),
                _ => Batch::new().put(keys::record_key(5), vec![1, 0, 0, 0]),
            };
            let _ = s.apply(&p, &batch).unwrap();
            let mut seen = Vec::new();
            let err = log::visit_log(s, &p, 1, 10, |r| {
                seen.push(r.seq);
                Ok::<(), Error>(())
            })
            .unwrap_err();
            match (&err, log::read_log(s, &p, 1, 10).unwrap_err()) {
                (Error::Corrupt { detail, .. }, Error::Corrupt { detail: copied, .. }) => {
                    assert_eq!(detail, want, "{}: {damage}", b.name);
                    assert_eq!(copied, want, "{}: {damage}", b.name);
                }
                (other, copied) => panic!("{}: {damage}: {other} / {copied}", b.name),
            }
            assert_eq!(seen, vec![1, 2, 3, 4], "{}: {damage}", b.name);
            // Pages that end before the damage read cleanly.
            assert_eq!(visited(s, &p, 1, 4).unwrap().1, Some(5));
        }
        // The visitor's own error, of its own type, stops the read at once.
        #[derive(Debug, PartialEq)]
        enum Stop {
            At(u64),
            Store(String),
        }
        impl From<Error> for Stop {
            fn from(e: Error) -> Stop {
                Stop::Store(e.to_string())
            }
        }
        let p = part("lend-stop");
        append_n(s, &p, 10);
        let mut seen = 0;
        let stopped = log::visit_log(s, &p, 1, 10, |r| {
            seen += 1;
            if r.seq == 3 {
                return Err(Stop::At(r.seq));
            }
            Ok(())
        });
        assert_eq!(stopped, Err(Stop::At(3)), "{}", b.name);
        assert_eq!(seen, 3);
    });
}

/// A record missing exactly where a page starts is `Corrupt` too, however the log is paged: a
/// gap anywhere in the retained history is damage, not the end of a page (SPEC L2). Only the
/// truncated prefix may be skipped: a read from before it starts at the first retained record,
/// and that record missing is a gap like any other.
#[test]
fn l2_a_record_missing_at_a_page_boundary_is_corrupt() {
    each_backend(|b| {
        let s = &*b.store;
        let p = part("boundary");
        append_n(s, &p, 10);
        let _ = s
            .apply(&p, &Batch::new().delete(keys::record_key(5)))
            .unwrap();
        // The page before the gap ends cleanly and says where the next one starts.
        let page = log::read_log(s, &p, 1, 4).unwrap();
        assert_eq!(
            (page.records.len(), page.next_seq),
            (4, Some(5)),
            "{}",
            b.name
        );
        let want = "log record 5 is missing (found 6)";
        let mut seen = Vec::new();
        let lent = log::visit_log(s, &p, 5, 4, |r| {
            seen.push(r.seq);
            Ok::<(), Error>(())
        });
        for err in [log::read_log(s, &p, 5, 4).unwrap_err(), lent.unwrap_err()] {
            match err {
                Error::Corrupt { detail, .. } => assert_eq!(detail, want, "{}", b.name),
                other => panic!("{}: {other}", b.name),
            }
        }
        assert!(seen.is_empty(), "{}: the visitor saw {seen:?}", b.name);
        // Paging through the whole log stops at the gap, whatever the page size.
        for limit in [1, 2, 4] {
            let mut from = Some(1);
            let err = loop {
                match log::read_log(s, &p, from.unwrap(), limit) {
                    Ok(page) => from = page.next_seq,
                    Err(e) => break e,
                }
                assert!(from.is_some(), "{}: paged past the gap at {limit}", b.name);
            };
            assert!(matches!(err, Error::Corrupt { .. }), "{}: {err}", b.name);
        }
        // The first record missing is a gap as well.
        let first = part("boundary-first");
        append_n(s, &first, 3);
        let _ = s
            .apply(&first, &Batch::new().delete(keys::record_key(1)))
            .unwrap();
        for from in [0, 1] {
            assert!(
                matches!(
                    log::read_log(s, &first, from, 2),
                    Err(Error::Corrupt { .. })
                ),
                "{}: from {from}",
                b.name
            );
        }
        // After truncation a read from before the first retained record starts there; that
        // record missing is a gap.
        let cut = part("boundary-truncated");
        append_n(s, &cut, 20);
        let head = log::read_head(s, &cut).unwrap();
        let head = log::write_checkpoint(s, &cut, &head, 15, b"s".to_vec(), Batch::new())
            .unwrap()
            .committed()
            .unwrap();
        log::truncate_before(s, &cut, &head, 16)
            .unwrap()
            .committed()
            .unwrap();
        let page = log::read_log(s, &cut, 3, 2).unwrap();
        let seqs: Vec<u64> = page.records.iter().map(|r| r.seq).collect();
        assert_eq!(
            (seqs, page.next_seq),
            (vec![16, 17], Some(18)),
            "{}",
            b.name
        );
        let _ = s
            .apply(&cut, &Batch::new().delete(keys::record_key(16)))
            .unwrap();
        for from in [3, 16] {
            match log::read_log(s, &cut, from, 2).unwrap_err() {
                Error::Corrupt { detail, .. } => {
                    assert_eq!(detail, "log record 16 is missing (found 17)", "{}", b.name)
                }
                other => panic!("{}: {other}", b.name),
            }
        }
    });
}

#[test]
fn l3_checkpoint_then_replay_only_the_tail() {
    each_backend(|b| {
        let s = &*b.store;
        let p = part("ckpt");
        append_n(s, &p, 10);
        let head = log::read_head(s, &p).unwrap();
        let at = log::write_checkpoint(s, &p, &head, 6, b"state@6".to_vec(), Batch::new())
            .unwrap()
            .committed()
            .unwrap();
        append_n(s, &p, 2);
        let (head, ckpt) = log::load_restore_point(s, &p).unwrap();
        let ckpt = ckpt.unwrap();
        assert_eq!(
            (ckpt.seq, ckpt.state.as_slice()),
            (6, &b"state@6"[..]),
            "{}",
            b.name
        );
        assert_eq!(at.head.checkpoint, Some(ckpt.mark()));
        let mut tail = Vec::new();
        let n = log::replay::<Error>(s, &p, &head.head, ckpt.seq, ckpt.digest, |r| {
            tail.push(r.seq);
            Ok(())
        })
        .unwrap();
        assert_eq!(n, 6);
        assert_eq!(tail, vec![7, 8, 9, 10, 11, 12]);
        // An older checkpoint than the newest is refused.
        assert!(log::write_checkpoint(s, &p, &head, 3, vec![], Batch::new()).is_err());
    });
}

#[test]
fn l3_truncation_keeps_restore_and_verification_working() {
    each_backend(|b| {
        let s = &*b.store;
        let p = part("trunc");
        append_n(s, &p, 20);
        let head = log::read_head(s, &p).unwrap();
        // Nothing is covered by a checkpoint yet: truncation is refused.
        assert!(log::truncate_before(s, &p, &head, 5).is_err(), "{}", b.name);
        let head = log::write_checkpoint(s, &p, &head, 15, b"s".to_vec(), Batch::new())
            .unwrap()
            .committed()
            .unwrap();
        assert!(log::truncate_before(s, &p, &head, 17).is_err());
        let head = log::truncate_before(s, &p, &head, 16)
            .unwrap()
            .committed()
            .unwrap();
        assert_eq!(head.head.first_seq, 16);
        let page = log::read_log(s, &p, 1, 100).unwrap();
        assert_eq!(page.records.first().map(|r| r.seq), Some(16));
        let (head, ckpt) = log::load_restore_point(s, &p).unwrap();
        let ckpt = ckpt.unwrap();
        let n = log::replay::<Error>(s, &p, &head.head, ckpt.seq, ckpt.digest, |_| Ok(())).unwrap();
        assert_eq!(n, 5);
        log::verify_checkpoint_against_history(s, &p, &ckpt.mark()).unwrap();
        // The truncated rows are gone from the partition.
        assert!(s.get(&p, &keys::record_key(3)).unwrap().is_none());
    });
}

#[test]
fn l4_digest_chains_every_record() {
    each_backend(|b| {
        let s = &*b.store;
        let p = part("digest");
        log::append(s, &p, &[b"a".to_vec(), b"b".to_vec()], Batch::new())
            .unwrap()
            .committed()
            .unwrap();
        let d1 = chain_digest(GENESIS_DIGEST, 1, b"a");
        let d2 = chain_digest(d1, 2, b"b");
        let records = all_records(s, &p);
        assert_eq!(
            (records[0].digest, records[1].digest),
            (d1, d2),
            "{}",
            b.name
        );
        assert_eq!(log::read_head(s, &p).unwrap().head.digest, d2);
    });
}

#[test]
fn l4_a_tampered_record_stops_replay_before_it_is_applied() {
    each_backend(|b| {
        let s = &*b.store;
        let p = part("tamper");
        append_n(s, &p, 5);
        // Rewrite record 3's payload but keep its stored digest: history no longer matches.
        let row = s.get(&p, &keys::record_key(3)).unwrap().unwrap();
        let mut forged = row.clone();
        *forged.last_mut().unwrap() ^= 1;
        let _ = s
            .apply(&p, &Batch::new().put(keys::record_key(3), forged))
            .unwrap();
        let head = log::read_head(s, &p).unwrap().head;
        let mut applied = Vec::new();
        let err = log::replay::<Error>(s, &p, &head, 0, GENESIS_DIGEST, |r| {
            applied.push(r.seq);
            Ok(())
        })
        .unwrap_err();
        assert!(matches!(err, Error::Corrupt { .. }), "{}: {err}", b.name);
        assert_eq!(applied, vec![1, 2]);
        // A missing record is a gap, also corrupt.
        let _ = s
            .apply(
                &p,
                &Batch::new()
                    .put(keys::record_key(3), row)
                    .delete(keys::record_key(4)),
            )
            .unwrap();
        let err = log::replay::<Error>(s, &p, &head, 0, GENESIS_DIGEST, |_| Ok(())).unwrap_err();
        assert!(matches!(err, Error::Corrupt { .. }));
    });
}

#[test]
fn l4_a_checkpoint_that_does_not_match_its_history_is_detected() {
    each_backend(|b| {
        let s = &*b.store;
        let p = part("forged");
        append_n(s, &p, 8);
        let head = log::read_head(s, &p).unwrap();
        log::write_checkpoint(s, &p, &head, 5, b"good".to_vec(), Batch::new())
            .unwrap()
            .committed()
            .unwrap();
        // Forge a checkpoint (and the head's mark) claiming a digest from another history.
        let mut head = log::read_head(s, &p).unwrap().head;
        let forged = Checkpoint {
            seq: 5,
            digest: 0xdead_beef,
            state: b"evil".to_vec(),
        };
        head.checkpoint = Some(forged.mark());
        let _ = s
            .apply(
                &p,
                &Batch::new()
                    .put(keys::checkpoint_key(), forged.encode())
                    .put(keys::head_key(), head.encode()),
            )
            .unwrap();
        let err = log::load_restore_point(s, &p).unwrap_err();
        assert!(matches!(err, Error::Corrupt { .. }), "{}: {err}", b.name);
        assert!(err.to_string().contains("checkpoint"));
        let err = log::verify_checkpoint_against_history(s, &p, &forged.mark()).unwrap_err();
        assert!(matches!(err, Error::Corrupt { .. }));
    });
}

/// Replays a 600-record log (three replay pages) with one record damaged: every record before
/// it is applied in order, none from it on, and the error names it exactly as a
/// record-by-record check does, wherever in a page it sits (SPEC L3, L4).
#[test]
fn l4_replay_stops_at_the_first_damaged_record_of_any_page() {
    const N: u64 = 600;
    each_backend(|b| {
        let s = &*b.store;
        for at in [1, 2, 5, 200, 256, 257, 300, 512, 513, 599, 600] {
            for damage in ["digest", "payload", "truncated", "missing"] {
                let p = part(&format!("damage-{at}-{damage}"));
                append_n(s, &p, N as usize);
                let head = log::read_head(s, &p).unwrap().head;
                let clean = all_records(s, &p);
                let row = s.get(&p, &keys::record_key(at)).unwrap().unwrap();
                let mut batch = Batch::new();
                let mut forged = row.clone();
                match damage {
                    // Byte 1 is the low byte of the stored digest, after the version byte.
                    "digest" => forged[1] ^= 1,
                    "payload" => *forged.last_mut().unwrap() ^= 1,
                    "truncated" => forged.truncate(4),
                    _ => {}
                }
                batch = if damage == "missing" {
                    batch.delete(keys::record_key(at))
                } else {
                    batch.put(keys::record_key(at), forged)
                };
                let _ = s.apply(&p, &batch).unwrap();
                let mut applied = Vec::new();
                let err = log::replay::<Error>(s, &p, &head, 0, GENESIS_DIGEST, |r| {
                    applied.push(r.seq);
                    Ok(())
                })
                .unwrap_err();
                let want = match damage {
                    "digest" => format!(
                        "log record {at} has digest {:016x}, its history gives {:016x}",
                        clean[at as usize - 1].digest ^ 1,
                        clean[at as usize - 1].digest
                    ),
                    "payload" => {
                        let previous = match at {
                            1 => GENESIS_DIGEST,
                            _ => clean[at as usize - 2].digest,
                        };
                        let mut payload = clean[at as usize - 1].payload.clone();
                        *payload.last_mut().unwrap() ^= 1;
                        format!(
                            "log record {at} has digest {:016x}, its history gives {:016x}",
                            clean[at as usize - 1].digest,
                            chain_digest(previous, at, &payload)
                        )
                    }
                    "truncated" => format!("log record {at} is truncated"),
                    _ if at == N => format!("log record {at} is missing"),
                    _ => format!("log record {at} is missing (found {})", at + 1),
                };
                match err {
                    Error::Corrupt { detail, .. } => {
                        assert_eq!(detail, want, "{}: {damage} at {at}", b.name)
                    }
                    other => panic!("{}: {damage} at {at}: {other}", b.name),
                }
                assert_eq!(
                    applied,
                    (1..at).collect::<Vec<u64>>(),
                    "{}: {damage} at {at}",
                    b.name
                );
            }
        }
    });
}
