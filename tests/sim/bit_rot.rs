//! Bit rot after the store workload's run: one bit of one acknowledged value flips where the
//! value lies on the disk, and a store reopened on that disk must notice (SPEC S4).
//!
//! The value is one whose bytes lie exactly once on the disk (a value compaction copied and
//! whose old segment is still there would have two), so no other copy can answer for it, and
//! whose record the journal proves durable: in a sealed segment, or in the newest one with a
//! later record framed once it was durable. (Damage in the newest segment that nothing after
//! it proves durable is indistinguishable from a torn write, and is cut as one: the limit
//! docs/DESIGN.md states.) Checked, reading each partition's acknowledged keys one by one and
//! all at once:
//!
//! - the damaged value is never served: its reads answer `Corrupt`;
//! - the damaged partition's other keys answer their acknowledged values or `Corrupt` (a load
//!   may refuse the whole partition), never wrong ones;
//! - every other partition answers every acknowledged value.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use portcullis::Error;
use portcullis::store::{FaultFs, FileStore, Partition, PathKind, Store, Vfs};

use super::layout::valid_records;
use super::store_load::{Acked, counter};
use super::{Rng, Trace};

/// Every file under `dir`, with its bytes.
fn files_under(fs: &FaultFs, dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    let mut names = fs.list(dir).unwrap_or_default();
    names.sort();
    for name in names {
        let path = dir.join(name);
        match fs.kind(&path) {
            Ok(Some(PathKind::Dir)) => files.extend(files_under(fs, &path)),
            Ok(Some(PathKind::File)) => {
                if let Some(bytes) = fs.read_file(&path) {
                    files.push((path, bytes));
                }
            }
            _ => {}
        }
    }
    files
}

/// Where `needle` lies in `files`: every (file index, offset).
fn occurrences(files: &[(PathBuf, Vec<u8>)], needle: &[u8]) -> Vec<(usize, usize)> {
    let mut found = Vec::new();
    for (f, (_, bytes)) in files.iter().enumerate() {
        let starts = bytes.windows(needle.len()).enumerate();
        found.extend(
            starts
                .filter(|(_, w)| w[0] == needle[0] && *w == needle)
                .map(|(at, _)| (f, at)),
        );
    }
    found
}

/// Whether the journal proves durable the record holding byte `at` of `files[f]`: the
/// records of a segment sealed before a later one got records all are; in the newest segment
/// with records, a later record must have been framed once its LSN was durable. (A later
/// segment file without records proves nothing: its creation may have failed, as on a disk
/// that died there, and open then takes the segment before it for the newest.)
fn proven_durable(files: &[(PathBuf, Vec<u8>)], f: usize, at: usize) -> bool {
    let (path, bytes) = &files[f];
    let is_segment = |p: &Path| p.extension().is_some_and(|e| e == "seg");
    if !is_segment(path) {
        return false;
    }
    let newest = files
        .iter()
        .filter(|(p, bytes)| is_segment(p) && !valid_records(bytes).is_empty())
        .map(|(p, _)| p)
        .max();
    if Some(path) != newest {
        return true;
    }
    // Stopping at the first record that is not valid, not looking past it for later ones as
    // open does, finds fewer proofs than open can, never more.
    let records = valid_records(bytes);
    let Some(i) = records.iter().position(|r| r.offset <= at && at < r.end()) else {
        return false;
    };
    records[i + 1..]
        .iter()
        .any(|later| later.synced_lsn >= records[i].lsn)
}

/// What one read of one key answered.
type Answer = portcullis::Result<Option<Vec<u8>>>;

/// Whether `got` is what was acknowledged for `key` (a counter: at least it).
fn is_acked(key: &str, acked: &[u8], got: &[u8]) -> bool {
    if key.ends_with('c') {
        counter(got) >= counter(acked)
    } else {
        got == acked
    }
}

/// Flips one bit of one acknowledged value on `image`, reopens it with `open` and checks the
/// store's answers (see the module's documentation). Does nothing if no value lies once.
pub fn check(
    image: FaultFs,
    acked: &Acked,
    rng: &mut Rng,
    open: impl Fn(FaultFs) -> FileStore,
    trace: &Trace,
) {
    let mut files = files_under(&image, Path::new("/sim"));
    // The fresh values (not counters), tried from a point the seed picks, in turn, until one
    // qualifies.
    let fresh: Vec<(&(String, String), &Vec<u8>)> = acked
        .0
        .iter()
        .filter(|((_, key), _)| !key.ends_with('c'))
        .collect();
    let start = rng.below(fresh.len().max(1) as u64) as usize;
    let chosen = (0..fresh.len())
        .map(|i| fresh[(start + i) % fresh.len()])
        .find_map(|(pk, value)| match occurrences(&files, value)[..] {
            [(f, at)] if proven_durable(&files, f, at) => Some((pk, value, (f, at))),
            _ => None,
        });
    let Some(((damaged_p, damaged_key), value, (f, at))) = chosen else {
        trace.push("bit rot: no acknowledged value lies once on the disk, proven durable".into());
        return;
    };
    let flip = at + rng.below(value.len() as u64) as usize;
    let (path, bytes) = &mut files[f];
    bytes[flip] ^= 1 << rng.below(8);
    image
        .write_file(path, bytes.clone())
        .expect("the damaged file is written back");
    trace.push(format!(
        "bit rot: {damaged_p}/{damaged_key} at {} byte {flip}",
        path.display()
    ));

    let store = open(image);
    let mut by_partition: BTreeMap<&str, Vec<(&str, &[u8])>> = BTreeMap::new();
    for ((p, key), value) in &acked.0 {
        by_partition.entry(p).or_default().push((key, value));
    }
    let mut refused_here = Vec::new();
    for (p, keys) in by_partition {
        let partition = Partition::new(p).unwrap();
        let mut answers: Vec<(&str, Answer)> = keys
            .iter()
            .map(|&(key, _)| (key, store.get(&partition, key.as_bytes())))
            .collect();
        let key_list: Vec<&[u8]> = keys.iter().map(|&(key, _)| key.as_bytes()).collect();
        match store.get_many(&partition, &key_list) {
            Ok(values) => answers.extend(
                keys.iter()
                    .map(|&(key, _)| key)
                    .zip(values.into_iter().map(Ok)),
            ),
            Err(e) => answers.push(("(all at once)", Err(e))),
        }
        for (key, got) in answers {
            let expected = keys.iter().find(|&&(k, _)| k == key).map(|&(_, v)| v);
            match (got, expected) {
                (Ok(Some(v)), Some(expected)) if p == damaged_p && key == damaged_key => panic!(
                    "S4: the damaged value {p}/{key} was served ({})",
                    if v == expected {
                        "unchanged: the flip missed where the value is read from"
                    } else {
                        "wrong bytes"
                    }
                ),
                (Ok(Some(v)), Some(expected)) if is_acked(key, expected, &v) => {}
                (Err(Error::Corrupt { .. }), _) => refused_here.push(format!("{p}/{key}")),
                (other, _) => panic!(
                    "S4: after bit rot in {damaged_p}/{damaged_key}, {p}/{key} reads {:?} \
                     (open found: {:?})",
                    other.map(|v| v.map(|v| String::from_utf8_lossy(&v).into_owned())),
                    store.open_report()
                ),
            }
        }
    }
    // Beyond the damaged value itself (and a read of its whole partition at once, which
    // includes it), a refusal is one the store reports (SPEC S4: named, and kept until an
    // operator acts): a value's own damage fails its reads, a load's refuses its partition.
    let damage = store.damage();
    let listed = |p: &str| {
        damage.partitions.iter().any(|r| {
            r.partition
                .as_ref()
                .is_some_and(|named| named.as_bytes() == p.as_bytes())
        })
    };
    for refused in &refused_here {
        let (p, key) = refused.split_once('/').unwrap();
        let the_damage =
            p == damaged_p.as_str() && (key == damaged_key.as_str() || key == "(all at once)");
        assert!(
            the_damage || listed(p),
            "S4: after bit rot in {damaged_p}/{damaged_key}, {refused} answered Corrupt, but \
             the store does not report {p} as refused: {damage:?}"
        );
    }
    assert!(
        refused_here
            .iter()
            .any(|r| r.starts_with(&format!("{damaged_p}/{damaged_key}"))),
        "S4: the damaged value {damaged_p}/{damaged_key} was not refused"
    );
    trace.push(format!(
        "bit rot: checked; refused {} reads, of {} partitions the store reports, {} unattributed",
        refused_here.len(),
        damage.partitions.len(),
        damage.unattributed.len()
    ));
    let _ = store.close();
}
