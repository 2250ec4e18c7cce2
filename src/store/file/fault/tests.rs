//! Tests of the crash model itself: if these are wrong, every crash test built on it lies.

use std::io;
use std::path::Path;

use super::{FailMode, FaultFs};
use crate::store::file::vfs::{OpenMode, PathKind, Vfs};

const SEEDS: u64 = 200;

fn p(s: &str) -> &Path {
    Path::new(s)
}

/// A disk with `/d` durably holding an empty file `/d/f`.
fn disk_with_file() -> FaultFs {
    let fs = FaultFs::new();
    fs.create_dir_all(p("/d")).unwrap();
    fs.open(p("/d/f"), OpenMode::CreateNew).unwrap();
    fs.sync_dir(p("/d")).unwrap();
    fs
}

/// Every distinct content of `/d/f` (None if missing) over many crash seeds.
fn outcomes(fs: &FaultFs) -> Vec<Option<Vec<u8>>> {
    let mut seen: Vec<Option<Vec<u8>>> = (0..SEEDS)
        .map(|s| fs.crash(s).read_file(p("/d/f")))
        .collect();
    seen.sort();
    seen.dedup();
    seen
}

#[test]
fn synced_writes_survive_every_crash() {
    let fs = disk_with_file();
    let f = fs.open(p("/d/f"), OpenMode::ReadWrite).unwrap();
    f.write_all_at(b"hello", 0).unwrap();
    f.sync_data().unwrap();
    assert!(!fs.has_unsynced());
    assert_eq!(outcomes(&fs), vec![Some(b"hello".to_vec())]);
}

#[test]
fn unsynced_writes_may_be_dropped_or_kept_in_order() {
    let fs = disk_with_file();
    let f = fs.open(p("/d/f"), OpenMode::ReadWrite).unwrap();
    f.write_all_at(b"aa", 0).unwrap();
    f.sync_data().unwrap();
    f.write_all_at(b"bb", 2).unwrap();
    f.write_all_at(b"cc", 4).unwrap();
    let seen = outcomes(&fs);
    // Whole writes survive in order: never "cc" without "bb".
    for bytes in [&b"aa"[..], b"aabb", b"aabbcc"] {
        assert!(seen.contains(&Some(bytes.to_vec())), "{bytes:?} never seen");
    }
    for image in seen.iter().flatten() {
        assert!(image.starts_with(b"aa"), "{image:?}");
        if image.len() == 6 && image[4..] == *b"cc" {
            assert_eq!(&image[2..4], b"bb", "a later write survived an earlier one");
        }
    }
}

#[test]
fn the_write_after_the_kept_ones_may_be_torn_or_garbled() {
    let fs = disk_with_file();
    let f = fs.open(p("/d/f"), OpenMode::ReadWrite).unwrap();
    f.write_all_at(&[7u8; 64], 0).unwrap();
    let seen = outcomes(&fs);
    let torn = seen
        .iter()
        .flatten()
        .any(|b| !b.is_empty() && b.len() < 64 && b.iter().all(|&x| x == 7));
    let garbled = seen
        .iter()
        .flatten()
        .any(|b| b.first() == Some(&7) && b.iter().any(|&x| x != 7));
    assert!(torn, "no torn prefix among {} images", seen.len());
    assert!(
        garbled,
        "no garbage after a torn prefix among {} images",
        seen.len()
    );
    assert!(seen.iter().flatten().all(|b| b.len() <= 64));
}

#[test]
fn a_new_file_needs_a_directory_sync() {
    let fs = FaultFs::new();
    fs.create_dir_all(p("/d")).unwrap();
    let f = fs.open(p("/d/f"), OpenMode::CreateNew).unwrap();
    f.write_all_at(b"x", 0).unwrap();
    f.sync_data().unwrap();
    let seen = outcomes(&fs);
    assert!(
        seen.contains(&None) && seen.contains(&Some(b"x".to_vec())),
        "{seen:?}"
    );
    fs.sync_dir(p("/d")).unwrap();
    assert_eq!(outcomes(&fs), vec![Some(b"x".to_vec())]);
    // The directory itself was durable from the start.
    assert_eq!(fs.crash(3).kind(p("/d")).unwrap(), Some(PathKind::Dir));
}

#[test]
fn a_rename_without_directory_sync_may_revert_but_never_loses_both() {
    let fs = disk_with_file();
    let f = fs.open(p("/d/f"), OpenMode::ReadWrite).unwrap();
    f.write_all_at(b"old", 0).unwrap();
    f.sync_data().unwrap();
    let t = fs.open(p("/d/tmp"), OpenMode::CreateNew).unwrap();
    t.write_all_at(b"new", 0).unwrap();
    t.sync_data().unwrap();
    fs.rename(p("/d/tmp"), p("/d/f")).unwrap();
    assert_eq!(fs.read_file(p("/d/f")).unwrap(), b"new");
    let seen = outcomes(&fs);
    assert_eq!(seen, vec![Some(b"new".to_vec()), Some(b"old".to_vec())]);
    fs.sync_dir(p("/d")).unwrap();
    assert_eq!(outcomes(&fs), vec![Some(b"new".to_vec())]);
    assert_eq!(fs.crash(1).list(p("/d")).unwrap(), vec!["f".to_string()]);
}

#[test]
fn a_removal_without_directory_sync_may_revert() {
    let fs = disk_with_file();
    fs.remove(p("/d/f")).unwrap();
    assert_eq!(fs.kind(p("/d/f")).unwrap(), None);
    let seen = outcomes(&fs);
    assert!(
        seen.contains(&None) && seen.contains(&Some(Vec::new())),
        "{seen:?}"
    );
}

#[test]
fn truncation_is_a_write_like_any_other() {
    let fs = disk_with_file();
    let f = fs.open(p("/d/f"), OpenMode::ReadWrite).unwrap();
    f.write_all_at(b"abcdef", 0).unwrap();
    f.sync_data().unwrap();
    f.set_len(2).unwrap();
    assert_eq!(f.len().unwrap(), 2);
    let seen = outcomes(&fs);
    assert_eq!(seen, vec![Some(b"ab".to_vec()), Some(b"abcdef".to_vec())]);
}

#[test]
fn crash_images_are_reproducible_and_independent() {
    let fs = disk_with_file();
    let f = fs.open(p("/d/f"), OpenMode::ReadWrite).unwrap();
    for i in 0..10u8 {
        f.write_all_at(&[i; 10], u64::from(i) * 10).unwrap();
    }
    for seed in 0..50 {
        assert_eq!(
            fs.crash(seed).read_file(p("/d/f")),
            fs.crash(seed).read_file(p("/d/f"))
        );
    }
    // Writing to an image changes neither the original nor other images.
    let image = fs.crash(5);
    image.open(p("/d/g"), OpenMode::CreateNew).unwrap();
    assert_eq!(fs.kind(p("/d/g")).unwrap(), None);
    assert_eq!(fs.read_file(p("/d/f")).unwrap().len(), 100);
}

#[test]
fn a_killed_process_keeps_everything_written() {
    let fs = FaultFs::new();
    fs.create_dir_all(p("/d")).unwrap();
    let f = fs.open(p("/d/f"), OpenMode::CreateNew).unwrap();
    f.write_all_at(b"kept", 0).unwrap();
    let image = fs.crash_process();
    assert_eq!(image.read_file(p("/d/f")).unwrap(), b"kept");
    assert!(!image.has_unsynced());
}

#[test]
fn fail_at_fails_exactly_that_operation() {
    let fs = disk_with_file();
    let before = fs.ops();
    fs.fail_at(before + 2, FailMode::Once);
    let f = fs.open(p("/d/f"), OpenMode::ReadWrite).unwrap(); // op before+1
    let err = f.write_all_at(b"x", 0).unwrap_err(); // op before+2
    assert_eq!(err.kind(), io::ErrorKind::Other);
    assert!(fs.injected().unwrap().contains("write_all_at /d/f"));
    assert_eq!(
        fs.read_file(p("/d/f")).unwrap(),
        b"",
        "a failed write changed the file"
    );
    f.write_all_at(b"y", 0).unwrap();
    f.sync_data().unwrap();
    assert_eq!(fs.ops(), before + 4);
    assert_eq!(outcomes(&fs), vec![Some(b"y".to_vec())]);
}

#[test]
fn a_dead_disk_refuses_every_later_change_but_still_reads() {
    let fs = disk_with_file();
    let f = fs.open(p("/d/f"), OpenMode::ReadWrite).unwrap();
    f.write_all_at(b"abc", 0).unwrap();
    fs.fail_at(fs.ops() + 1, FailMode::DeadDisk);
    assert!(f.sync_data().is_err());
    assert!(f.write_all_at(b"x", 0).is_err());
    assert!(f.set_len(0).is_err());
    assert!(f.sync_data().is_err());
    assert!(fs.sync_dir(p("/d")).is_err());
    assert!(fs.rename(p("/d/f"), p("/d/g")).is_err());
    assert!(fs.remove(p("/d/f")).is_err());
    assert!(fs.open(p("/d/h"), OpenMode::CreateNew).is_err());
    let mut buf = [0u8; 3];
    f.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"abc");
    assert_eq!(fs.list(p("/d")).unwrap(), vec!["f".to_string()]);
    // The failed sync lost the write for good.
    assert_eq!(outcomes(&fs), vec![Some(Vec::new())]);
    fs.clear_faults();
    f.sync_data().unwrap();
    assert_eq!(
        outcomes(&fs),
        vec![Some(Vec::new())],
        "a later sync saved a lost write"
    );
}

#[test]
fn failed_syncs_lose_the_writes_forever() {
    let fs = disk_with_file();
    let f = fs.open(p("/d/f"), OpenMode::ReadWrite).unwrap();
    f.write_all_at(b"one", 0).unwrap();
    f.sync_data().unwrap();
    fs.fail_syncs();
    f.write_all_at(b"two", 3).unwrap();
    assert!(f.sync_data().is_err());
    // Readers still see the write (it is in the page cache) ...
    assert_eq!(fs.read_file(p("/d/f")).unwrap(), b"onetwo");
    // ... but no crash keeps it, even after a later sync succeeds.
    fs.clear_faults();
    f.sync_data().unwrap();
    assert_eq!(outcomes(&fs), vec![Some(b"one".to_vec())]);
}

#[test]
fn read_only_refuses_changes() {
    let fs = disk_with_file();
    fs.set_read_only(true);
    let err = fs.open(p("/d/new"), OpenMode::CreateNew).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::ReadOnlyFilesystem);
    let f = fs.open(p("/d/f"), OpenMode::ReadWrite).unwrap();
    assert_eq!(
        f.write_all_at(b"x", 0).unwrap_err().kind(),
        io::ErrorKind::ReadOnlyFilesystem
    );
    assert!(fs.create_dir_all(p("/e")).is_err());
    fs.set_read_only(false);
    f.write_all_at(b"x", 0).unwrap();
}

#[test]
fn locks_are_exclusive_until_dropped_and_gone_after_a_crash() {
    let fs = FaultFs::new();
    fs.create_dir_all(p("/d")).unwrap();
    let guard = fs.try_lock(p("/d/LOCK")).unwrap();
    let again = fs.clone().try_lock(p("/d/LOCK")).unwrap_err();
    assert_eq!(again.kind(), io::ErrorKind::WouldBlock);
    let image = fs.crash_process();
    drop(image.try_lock(p("/d/LOCK")).unwrap());
    drop(guard);
    drop(fs.try_lock(p("/d/LOCK")).unwrap());
}

#[test]
fn open_modes_and_paths_behave_like_a_file_system() {
    let fs = FaultFs::new();
    assert_eq!(
        fs.open(p("/nodir/f"), OpenMode::CreateNew)
            .unwrap_err()
            .kind(),
        io::ErrorKind::NotFound
    );
    fs.create_dir_all(p("/a/b")).unwrap();
    assert_eq!(
        fs.open(p("/a/f"), OpenMode::Read).unwrap_err().kind(),
        io::ErrorKind::NotFound
    );
    let f = fs.open(p("/a/f"), OpenMode::CreateNew).unwrap();
    f.write_all_at(b"data", 0).unwrap();
    assert_eq!(
        fs.open(p("/a/f"), OpenMode::CreateNew).unwrap_err().kind(),
        io::ErrorKind::AlreadyExists
    );
    let r = fs.open(p("/a/f"), OpenMode::Read).unwrap();
    assert_eq!(
        r.write_all_at(b"x", 0).unwrap_err().kind(),
        io::ErrorKind::PermissionDenied
    );
    assert_eq!(
        fs.list(p("/a")).unwrap(),
        vec!["b".to_string(), "f".to_string()]
    );
    assert_eq!(fs.kind(p("/a/b")).unwrap(), Some(PathKind::Dir));
    assert_eq!(fs.kind(p("/a/f")).unwrap(), Some(PathKind::File));
    assert_eq!(fs.kind(p("/x/y")).unwrap(), None);
    assert!(
        fs.create_dir_all(p("/a/f/g")).is_err(),
        "a file became a directory"
    );
    assert!(
        fs.open(p("/a/b"), OpenMode::Read).is_err(),
        "a directory opened as a file"
    );
    fs.open(p("/a/f"), OpenMode::CreateTruncate).unwrap();
    assert_eq!(fs.read_file(p("/a/f")).unwrap(), b"");
    // A removed file stays readable through a handle opened before.
    let mut buf = [0u8; 4];
    f.write_all_at(b"keep", 0).unwrap();
    fs.remove(p("/a/f")).unwrap();
    f.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"keep");
}

#[test]
fn thousands_of_small_crash_images_are_cheap() {
    let fs = disk_with_file();
    let f = fs.open(p("/d/f"), OpenMode::ReadWrite).unwrap();
    for i in 0..200u64 {
        f.write_all_at(&[1u8; 100], i * 100).unwrap();
        if i % 10 == 0 {
            f.sync_data().unwrap();
        }
    }
    let start = std::time::Instant::now();
    for seed in 0..5000 {
        let image = fs.crash(seed);
        assert!(image.read_file(p("/d/f")).unwrap().len() >= 19_100);
    }
    // Generous: this is a smoke test of cost, not a benchmark.
    assert!(start.elapsed().as_secs() < 30);
}

#[test]
fn a_fork_keeps_unsynced_state_and_is_independent() {
    let fs = disk_with_file();
    let f = fs.open(p("/d/f"), OpenMode::ReadWrite).unwrap();
    f.write_all_at(b"unsynced", 0).unwrap();
    let fork = fs.fork();
    f.sync_data().unwrap();
    assert!(fork.has_unsynced());
    assert!(outcomes(&fork).contains(&Some(Vec::new())));
    drop(fork.try_lock(p("/d/LOCK")).unwrap());
}
