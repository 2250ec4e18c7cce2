//! `portcullis-inspect` on healthy and damaged stores (SPEC E5): it reports what the store
//! holds, finds every kind of damage that `tests/corruption.rs` makes, refuses a store another
//! process has open, and never changes a byte of the directory.

#[path = "../../tests/common/layout.rs"]
#[allow(dead_code)]
mod layout;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use portcullis::store::{Batch, FileStore, Partition, Store};
use portcullis::typed::{Typed, TypedMachine};
use portcullis::{ApplyContext, Engine, EntityId, Namespace, Rejection};

struct Count;

impl TypedMachine for Count {
    type Record = String;
    type State = u64;
    fn fresh(&self, _: &EntityId) -> u64 {
        0
    }
    fn apply(&self, n: &mut u64, _: &ApplyContext<'_>, _: String) -> Result<(), Rejection> {
        *n += 1;
        Ok(())
    }
}

/// Serialises the tests of this file. A child process forked by one test (before it execs the
/// tool) briefly holds copies of every open file of this process, so a store another test just
/// closed could still look locked (SPEC S6) to the next open.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs the tool; returns its exit code and what it printed.
fn inspect(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_portcullis-inspect"))
        .args(args)
        .output()
        .expect("the tool runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().expect("an exit code"), text)
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Every file under `dir` with its bytes and permissions.
fn image(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                files.insert(p.clone(), b"<dir>".to_vec());
                dirs.push(p);
            } else {
                files.insert(p.clone(), std::fs::read(&p).unwrap());
            }
        }
    }
    files
}

fn room(i: usize) -> EntityId {
    EntityId::new("chat", format!("room-{i}")).unwrap()
}

/// A store written through an engine: five rooms with history, a checkpoint, an epoch bump and
/// leases, a plain partition; small segments so the journal spans several. Closed cleanly, so a
/// snapshot covers everything and open reads no record.
fn healthy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::builder(Typed(Count))
        .directory(dir.path())
        .file_store(|s| {
            s.segment_bytes(4096)
                .snapshot_every_bytes(1 << 40)
                .auto_compact(false)
        })
        .register_on_first_write(true)
        .pool_threads(1)
        .open()
        .unwrap();
    for i in 0..5 {
        for m in 0..20 {
            engine
                .append_typed(&room(i), &[format!("message {m} of a long enough text")])
                .unwrap();
        }
    }
    engine.checkpoint(&room(0)).unwrap();
    let chat = Namespace::new("chat").unwrap();
    engine.bump_epoch(&chat, 1).unwrap();
    // Serve the namespace again under the new epoch (SPEC F11).
    engine.release_namespace(&chat).unwrap();
    assert_eq!(engine.own(&chat).unwrap(), 1);
    engine.append_typed(&room(1), &["after".into()]).unwrap();
    engine.close().unwrap();
    let store = FileStore::open(dir.path()).unwrap();
    let plain = Partition::new("plain").unwrap();
    assert!(
        store
            .apply(&plain, &Batch::new().put(b"k".to_vec(), b"v".to_vec()))
            .unwrap()
            .is_committed()
    );
    store.close().unwrap();
    dir
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut segs: Vec<PathBuf> = std::fs::read_dir(dir.join("journal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    segs.sort();
    segs
}

fn damage(file: &Path, f: impl FnOnce(&mut Vec<u8>)) {
    let mut bytes = std::fs::read(file).unwrap();
    f(&mut bytes);
    std::fs::write(file, bytes).unwrap();
}

/// Runs the summary and `verify`, checks neither changed the directory, and returns verify's
/// exit code and output.
fn verify_unchanged(dir: &Path) -> (i32, String) {
    let before = image(dir);
    let (code, summary) = inspect(&[path(dir)]);
    assert!(code == 0 || code == 2, "{summary}");
    let verified = inspect(&["verify", path(dir)]);
    assert_eq!(image(dir), before, "inspecting changed the directory");
    verified
}

#[test]
fn e5_a_healthy_store_is_described_and_verifies_clean() {
    let _serial = serial();
    let dir = healthy();
    let before = image(dir.path());
    let (code, out) = inspect(&[path(dir.path())]);
    assert_eq!(code, 0, "{out}");
    for expected in [
        "MANIFEST",
        "journal/0000000001.seg",
        "partitions: 8", // five rooms, the coordinator, the engine's own, and `plain`
        "entities: 5",
        "chat/room-0: records 1..21 (20 retained), checkpoint at 20",
        "chat/room-1: records 1..22 (21 retained), no checkpoint",
        "registered by incarnation 1",
        "lease epoch 1",
        "epoch 1, 5 leased shards",
        "authority generation 0",
        "incarnation 1 closed cleanly",
        "journal after the snapshot: 0 records",
    ] {
        assert!(out.contains(expected), "missing {expected:?} in:\n{out}");
    }
    let (code, out) = inspect(&["verify", path(dir.path())]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("no damage found"), "{out}");
    assert!(
        out.contains("5 entity digest chains, 1 checkpoints"),
        "{out}"
    );
    assert_eq!(
        image(dir.path()),
        before,
        "inspecting changed the directory"
    );
}

/// A flipped byte in a record that the snapshot covers: open does not read it, so only
/// `verify`'s full walk (and a later load of its partition) can find it.
#[test]
fn e5_verify_finds_a_flipped_byte_in_snapshotted_history() {
    let _serial = serial();
    let dir = healthy();
    let first = segments(dir.path()).remove(0);
    let bytes = std::fs::read(&first).unwrap();
    let victim = layout::records(&bytes)[2];
    damage(&first, |b| b[victim.offset + layout::FRAME_LEN + 3] ^= 0x40);
    let (code, out) = verify_unchanged(dir.path());
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!(
            "journal segment 1 offset {}: a damaged record",
            victim.offset
        )),
        "{out}"
    );
}

#[test]
fn e5_verify_finds_a_torn_tail() {
    let _serial = serial();
    let dir = healthy();
    let last = segments(dir.path()).pop().unwrap();
    let len = std::fs::metadata(&last).unwrap().len();
    let bytes = std::fs::read(&last).unwrap();
    let tail = *layout::records(&bytes).last().unwrap();
    // Cut the last record short, as a crash during its write would.
    damage(&last, |b| b.truncate(tail.offset + layout::FRAME_LEN + 1));
    assert!(std::fs::metadata(&last).unwrap().len() < len);
    let (code, out) = verify_unchanged(dir.path());
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("torn tail of"), "{out}");
}

#[test]
fn e5_verify_finds_a_removed_manifest_or_snapshot() {
    let _serial = serial();
    for remove_manifest in [true, false] {
        let dir = healthy();
        let victim = if remove_manifest {
            dir.path().join("MANIFEST")
        } else {
            std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().path())
                .find(|p| p.is_file() && !p.ends_with("MANIFEST") && !p.ends_with("LOCK"))
                .expect("a snapshot file")
        };
        std::fs::remove_file(&victim).unwrap();
        let (code, out) = verify_unchanged(dir.path());
        assert_eq!(code, 1, "{out}");
        let expected = if remove_manifest {
            "MANIFEST: missing"
        } else {
            "the snapshot the manifest names is missing"
        };
        assert!(out.contains(expected), "{out}");
    }
}

#[test]
fn e5_verify_finds_a_damaged_header_of_the_newest_segment() {
    let _serial = serial();
    let dir = healthy();
    let last = segments(dir.path()).pop().unwrap();
    damage(&last, |b| b[13] ^= 0xff);
    let (code, out) = verify_unchanged(dir.path());
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("bad header"), "{out}");
}

#[test]
fn e5_a_future_format_version_is_refused_without_changes() {
    let _serial = serial();
    let dir = healthy();
    let first = segments(dir.path()).remove(0);
    damage(&first, |b| layout::set_segment_version(b, 99));
    let before = image(dir.path());
    let (code, out) = inspect(&["verify", path(dir.path())]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("format version 99"), "{out}");
    assert_eq!(image(dir.path()), before);
}

/// History rewritten below the log with valid store checksums: only the digest chain (SPEC L4)
/// can tell. Record 2 of room-3 is replaced by a copy of record 1.
#[test]
fn l4_verify_finds_a_broken_digest_chain() {
    let _serial = serial();
    let dir = healthy();
    let store = FileStore::open(dir.path()).unwrap();
    let p = room(3).partition();
    let first = portcullis::log::keys::record_key(1);
    let copy = store.get(&p, &first).unwrap().unwrap();
    let batch = Batch::new().put(portcullis::log::keys::record_key(2), copy);
    assert!(store.apply(&p, &batch).unwrap().is_committed());
    store.close().unwrap();
    let (code, out) = verify_unchanged(dir.path());
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("entity chat/room-3:"), "{out}");
    assert!(!out.contains("room-2"), "only the rewritten entity: {out}");
}

#[test]
fn s6_a_store_open_in_another_handle_is_refused_and_bad_paths_are_named() {
    let _serial = serial();
    let dir = healthy();
    let store = FileStore::open(dir.path()).unwrap();
    let (code, out) = inspect(&["verify", path(dir.path())]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("locked"), "{out}");
    store.close().unwrap();
    assert_eq!(inspect(&["verify", path(dir.path())]).0, 0);

    let file = dir.path().join("MANIFEST");
    let (code, out) = inspect(&[path(&file)]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("not a directory"), "{out}");
    let (code, out) = inspect(&[path(&dir.path().join("nowhere"))]);
    assert_eq!(code, 2, "{out}");
    let (code, out) = inspect(&[]);
    assert_eq!(code, 2);
    assert!(out.contains("usage"), "{out}");
}

/// Asking for help is not a wrong invocation: `--help` and `-h` print the usage on standard
/// output and exit 0, while a wrong invocation prints it on standard error and exits 2.
#[test]
fn help_is_answered_with_the_usage_and_success() {
    for flag in ["--help", "-h"] {
        let out = Command::new(env!("CARGO_BIN_EXE_portcullis-inspect"))
            .arg(flag)
            .output()
            .expect("the tool runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{flag}: {stdout}");
        assert!(
            stdout.contains("usage: portcullis-inspect"),
            "{flag}: {stdout}"
        );
    }
    let out = Command::new(env!("CARGO_BIN_EXE_portcullis-inspect"))
        .args(["verify", "one", "two"])
        .output()
        .expect("the tool runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("usage"));
}

/// SPEC S4, E5: damage an earlier open found is persisted, and the store refuses it until an
/// operator accepts it. The summary lists what the store refuses, and `verify` reports each
/// refusal with the call that lifts it.
#[test]
fn s4_the_damage_the_store_persisted_is_shown_and_verified() {
    let _serial = serial();
    let dir = healthy();
    let first = segments(dir.path()).remove(0);
    let bytes = std::fs::read(&first).unwrap();
    let victim = layout::records(&bytes)[2];
    damage(&first, |b| b[victim.offset + layout::FRAME_LEN + 3] ^= 0x40);
    // An ordinary open finds the damage when the partition loads, and persists the refusal.
    let store = FileStore::open(dir.path()).unwrap();
    let mut refused = Vec::new();
    for p in store.list_partitions(b"").unwrap() {
        if store.get(&p, b"k").is_err() {
            refused.push(p);
        }
    }
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(store.damage().partitions.len(), 1);
    store.close().unwrap();

    let (code, summary) = inspect(&[path(dir.path())]);
    assert_eq!(code, 0, "{summary}");
    assert!(
        summary.contains(&format!(
            "refused by the store (persisted until an operator accepts it):\n  partition {}",
            refused[0]
        )),
        "{summary}"
    );
    let (code, out) = verify_unchanged(dir.path());
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!(
            "partition {}: refused by the store until an operator accepts it (FileStore::accept_damage)",
            refused[0]
        )),
        "{out}"
    );
    // A healthy store says it refuses nothing.
    let healthy = healthy();
    let (code, summary) = inspect(&[path(healthy.path())]);
    assert_eq!(code, 0, "{summary}");
    assert!(
        summary.contains("refused by the store: nothing"),
        "{summary}"
    );
}

/// The tool keeps a bounded number of files open, whatever the number of journal segments: a
/// store of 300 segments is summarised and verified under a limit of 48 file descriptors.
#[test]
fn e5_inspecting_many_segments_needs_a_bounded_number_of_descriptors() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::builder(dir.path())
        .segment_bytes(4096)
        .auto_compact(false)
        .open()
        .unwrap();
    let mut n = 0u32;
    while store.stats().segments < 300 {
        let p = Partition::new(format!("p{}", n % 20)).unwrap();
        let batch = Batch::new().put(format!("k{n}").into_bytes(), vec![n as u8; 1000]);
        assert!(store.apply(&p, &batch).unwrap().is_committed());
        n += 1;
    }
    store.close().unwrap();
    let limited = |args: &[&str]| {
        let out = Command::new("prlimit")
            .arg("--nofile=48:48")
            .arg(env!("CARGO_BIN_EXE_portcullis-inspect"))
            .args(args)
            .output()
            .expect("running the tool through prlimit");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), text)
    };
    let (code, summary) = limited(&[path(dir.path())]);
    assert_eq!(code, Some(0), "{summary}");
    assert!(summary.contains("partitions: 20"), "{summary}");
    let (code, out) = limited(&["verify", path(dir.path())]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("no damage found"), "{out}");
}

/// Refuses empty messages before they are written (SPEC R12).
struct NoEmpty;

impl TypedMachine for NoEmpty {
    type Record = String;
    type State = u64;
    fn fresh(&self, _: &EntityId) -> u64 {
        0
    }
    fn check(&self, _: &u64, _: &ApplyContext<'_>, text: &String) -> Result<(), Rejection> {
        if text.is_empty() {
            return Err(Rejection::new("an empty message"));
        }
        Ok(())
    }
    fn apply(&self, n: &mut u64, _: &ApplyContext<'_>, _: String) -> Result<(), Rejection> {
        *n += 1;
        Ok(())
    }
}

#[test]
fn e5_r12_deferred_records_set_aside_are_shown_and_verify_clean() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let open = || {
        Engine::builder(Typed(NoEmpty))
            .directory(dir.path())
            .pool_threads(1)
            // The room stays pending until its read, so the deferrals meet no state.
            .background_warm(false)
            .open()
            .unwrap()
    };
    let engine = open();
    engine.register(&room(0)).unwrap();
    engine.close().unwrap();
    let engine = open();
    for text in ["", "hello", ""] {
        engine.defer_typed(&room(0), &text.to_string()).unwrap();
    }
    assert_eq!(engine.read(&room(0), |n| *n).unwrap(), 1);
    engine.close().unwrap();
    let (code, out) = inspect(&[path(dir.path())]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(
            "chat/room-0: records 1..2 (1 retained), no checkpoint, 2 refused deferred (set aside)"
        ),
        "{out}"
    );
    let (code, out) = verify_unchanged(dir.path());
    assert_eq!(code, 0, "{out}");
}

/// Every row of every partition of the store in `dir`.
fn rows(dir: &Path) -> Vec<(String, Vec<u8>, Vec<u8>)> {
    let store = FileStore::open(dir).unwrap();
    let mut out = Vec::new();
    for p in store.list_partitions(b"").unwrap() {
        for row in store.entries(&p, portcullis::store::KeyRange::all()) {
            let (k, v) = row.unwrap();
            out.push((p.to_string(), k, v));
        }
    }
    store.close().unwrap();
    out
}

#[test]
fn s12_backup_copies_a_closed_store_without_changing_it() {
    let _serial = serial();
    let dir = healthy();
    let before = image(dir.path());
    let out = tempfile::tempdir().unwrap();
    let dest = out.path().join("copy");
    let (code, text) = inspect(&["backup", path(dir.path()), path(&dest)]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("files linked"), "{text}");
    assert_eq!(image(dir.path()), before, "backing up changed the store");
    assert_eq!(inspect(&["verify", path(&dest)]).0, 0);
    assert_eq!(rows(&dest), rows(dir.path()));
    // A second backup to the same place is refused, and says what to do.
    let (code, text) = inspect(&["backup", path(dir.path()), path(&dest)]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("exists"), "{text}");
}

#[test]
fn s12_backup_of_a_torn_tail_copies_what_open_recovers_and_leaves_the_store_alone() {
    let _serial = serial();
    let dir = healthy();
    let last = segments(dir.path()).pop().unwrap();
    let bytes = std::fs::read(&last).unwrap();
    let tail = *layout::records(&bytes).last().unwrap();
    // A write a crash cut short after the last record: its frame and a byte of its body.
    let torn = bytes[tail.offset..tail.offset + layout::FRAME_LEN + 1].to_vec();
    damage(&last, |b| b.extend_from_slice(&torn));
    let before = image(dir.path());
    let (code, text) = inspect(&["verify", path(dir.path())]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("torn tail of"), "{text}");
    let out = tempfile::tempdir().unwrap();
    let dest = out.path().join("copy");
    let (code, text) = inspect(&["backup", path(dir.path()), path(&dest)]);
    assert_eq!(code, 0, "{text}");
    assert_eq!(image(dir.path()), before, "backing up changed the store");
    let (code, text) = inspect(&["verify", path(&dest)]);
    assert_eq!(code, 0, "the copy holds no torn tail: {text}");
    let copy = FileStore::open(&dest).unwrap();
    assert!(copy.open_report().torn_tail.is_none());
    copy.close().unwrap();
}

#[test]
fn s12_backup_refuses_an_open_store_and_a_directory_without_one() {
    let _serial = serial();
    let dir = healthy();
    let out = tempfile::tempdir().unwrap();
    let store = FileStore::open(dir.path()).unwrap();
    let (code, text) = inspect(&["backup", path(dir.path()), path(&out.path().join("a"))]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("locked"), "{text}");
    store.close().unwrap();
    let empty = tempfile::tempdir().unwrap();
    let (code, text) = inspect(&["backup", path(empty.path()), path(&out.path().join("b"))]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("holds no store"), "{text}");
    assert!(std::fs::read_dir(empty.path()).unwrap().next().is_none());
    assert!(std::fs::read_dir(out.path()).unwrap().next().is_none());
    let (code, text) = inspect(&["backup", path(dir.path())]);
    assert_eq!(code, 2);
    assert!(text.contains("backup SRC DEST"), "{text}");
}

#[test]
fn s12_backup_of_a_damaged_store_holds_the_same_damage() {
    let _serial = serial();
    let dir = healthy();
    let last = segments(dir.path()).pop().unwrap();
    let bytes = std::fs::read(&last).unwrap();
    let tail = *layout::records(&bytes).last().unwrap();
    // The newest segment lost its end: shorter than the heads snapshot says.
    damage(&last, |b| b.truncate(tail.offset + layout::FRAME_LEN + 1));
    let out = tempfile::tempdir().unwrap();
    let dest = out.path().join("copy");
    let (code, text) = inspect(&["backup", path(dir.path()), path(&dest)]);
    assert_eq!(code, 0, "{text}");
    for d in [dir.path(), dest.as_path()] {
        let (code, text) = inspect(&["verify", path(d)]);
        assert_eq!(code, 1, "{}: {text}", d.display());
        assert!(text.contains("torn tail of"), "{text}");
    }
}
