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
    fs.sync_dir(p("/")).unwrap();
    fs.open(p("/d/f"), OpenMode::CreateNew).unwrap();
    fs.sync_dir(p("/d")).unwrap();
    fs
}

/// Every distinct content of `/d/f` (None if missing) over many crash seeds.
fn outcomes(fs: &FaultFs) -> Vec<Option<Vec<u8>>> {
    outcomes_of(fs, "/d/f")
}

/// Every distinct content of a file (None if missing) over many crash seeds.
fn outcomes_of(fs: &FaultFs, path: &str) -> Vec<Option<Vec<u8>>> {
    let mut seen: Vec<Option<Vec<u8>>> =
        (0..SEEDS).map(|s| fs.crash(s).read_file(p(path))).collect();
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
fn unsynced_pages_survive_in_any_subset_and_order() {
    let fs = disk_with_file();
    let f = fs.open(p("/d/f"), OpenMode::ReadWrite).unwrap();
    f.write_all_at(b"aa", 0).unwrap();
    f.sync_data().unwrap();
    // Two writes on two pages, then one write spanning a page boundary.
    f.write_all_at(b"bb", 2).unwrap();
    f.write_all_at(b"cc", FaultFs::PAGE).unwrap();
    f.write_all_at(&[5u8; 8], 2 * FaultFs::PAGE - 4).unwrap();
    let seen = outcomes(&fs);
    let page = FaultFs::PAGE as usize;
    let has = |img: &Vec<u8>, at: usize, bytes: &[u8]| img.get(at..at + bytes.len()) == Some(bytes);
    let mut later_without_earlier = false;
    let mut write_split = false;
    let mut whole = false;
    for image in seen.iter().flatten() {
        assert!(image.starts_with(b"aa"), "synced bytes lost: {image:?}");
        later_without_earlier |= has(image, page, b"cc") && !has(image, 2, b"bb");
        // The spanning write's second page without its first.
        write_split |= has(image, 2 * page, &[5u8; 4]) && !has(image, 2 * page - 4, &[5u8; 4]);
        whole |= image.len() == 2 * page + 4 && has(image, 2, b"bb") && has(image, page, b"cc");
    }
    assert!(
        later_without_earlier,
        "a later write never survived without an earlier one"
    );
    assert!(write_split, "a write across pages never survived in part");
    assert!(whole, "the page cache never survived whole");
    assert!(
        seen.contains(&Some(b"aa".to_vec())),
        "nothing unsynced was ever dropped"
    );
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
fn a_new_directory_needs_its_parent_synced() {
    let fs = FaultFs::new();
    fs.create_dir_all(p("/a/b")).unwrap();
    let f = fs.open(p("/a/b/f"), OpenMode::CreateNew).unwrap();
    f.write_all_at(b"x", 0).unwrap();
    f.sync_data().unwrap();
    fs.sync_dir(p("/a/b")).unwrap();
    let seen = outcomes_of(&fs, "/a/b/f");
    assert!(
        seen.contains(&None),
        "an unsynced directory always survived"
    );
    assert!(seen.contains(&Some(b"x".to_vec())), "{seen:?}");
    // A lost directory takes its contents with it.
    for seed in 0..SEEDS {
        let image = fs.crash(seed);
        if image.kind(p("/a")).unwrap().is_none() {
            assert_eq!(image.kind(p("/a/b")).unwrap(), None);
        }
    }
    fs.sync_dir(p("/a")).unwrap();
    fs.sync_dir(p("/")).unwrap();
    assert_eq!(outcomes_of(&fs, "/a/b/f"), vec![Some(b"x".to_vec())]);
}

#[test]
fn a_failed_write_may_have_written_a_part() {
    let mut partial = false;
    for seed in 0..40 {
        let fs = disk_with_file();
        fs.set_fault_seed(seed);
        let f = fs.open(p("/d/f"), OpenMode::ReadWrite).unwrap();
        fs.fail_at(fs.ops() + 1, FailMode::Once);
        assert!(f.write_all_at(&[9u8; 100], 0).is_err());
        let now = fs.read_file(p("/d/f")).unwrap();
        assert!(now.len() <= 100 && now.iter().all(|&b| b == 9), "{now:?}");
        partial |= !now.is_empty() && now.len() < 100;
    }
    assert!(partial, "a failed write never left part of its bytes");
}

#[test]
fn crash_points_are_the_disk_before_each_change() {
    let fs = disk_with_file();
    fs.record_crash_points();
    let f = fs.open(p("/d/f"), OpenMode::ReadWrite).unwrap(); // a read: no point
    f.write_all_at(b"one", 0).unwrap();
    f.sync_data().unwrap();
    f.write_all_at(b"two", 3).unwrap();
    let points = fs.take_crash_points();
    let ops: Vec<u64> = points.iter().map(|c| c.op).collect();
    let start = ops[0];
    assert_eq!(ops, vec![start, start + 1, start + 2, start + 3]);
    assert!(points[0].what.starts_with("write_all_at"), "{points:?}");
    assert_eq!(points[0].kill().read_file(p("/d/f")).unwrap(), b"");
    // Before the sync: the write may or may not survive a power cut.
    let before_sync: Vec<Vec<u8>> = (0..SEEDS)
        .map(|s| points[1].power_cut(s).read_file(p("/d/f")).unwrap())
        .collect();
    assert!(before_sync.contains(&Vec::new()) && before_sync.contains(&b"one".to_vec()));
    // After it: it always does.
    for s in 0..SEEDS {
        assert!(points[2].power_cut(s).read_file(p("/d/f")).unwrap() == b"one");
    }
    assert_eq!(points[3].kill().read_file(p("/d/f")).unwrap(), b"onetwo");
    // Recording stopped.
    f.write_all_at(b"x", 0).unwrap();
    assert_eq!(fs.take_crash_points().len(), 1);
}

#[test]
fn a_new_file_needs_a_directory_sync() {
    let fs = FaultFs::new();
    fs.create_dir_all(p("/d")).unwrap();
    fs.sync_dir(p("/")).unwrap();
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
    // The directory itself is durable once its parent is synced.
    fs.sync_dir(p("/")).unwrap();
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
fn a_killed_process_keeps_everything_written_but_no_more_durable() {
    let fs = disk_with_file();
    let f = fs.open(p("/d/f"), OpenMode::ReadWrite).unwrap();
    f.write_all_at(b"kept", 0).unwrap();
    let image = fs.crash_process();
    assert_eq!(image.read_file(p("/d/f")).unwrap(), b"kept");
    assert!(image.has_unsynced());
    // A power cut after the kill may still lose it, until someone syncs it.
    let seen = outcomes(&image);
    assert!(seen.contains(&Some(Vec::new())), "{seen:?}");
    image
        .open(p("/d/f"), OpenMode::ReadWrite)
        .unwrap()
        .sync_data()
        .unwrap();
    assert_eq!(outcomes(&image), vec![Some(b"kept".to_vec())]);
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
    // A failed write may have done part of its work (here, of one byte: all or nothing).
    assert!(fs.read_file(p("/d/f")).unwrap().len() <= 1);
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
    // The failed sync settled what reached the disk, for good.
    let settled = outcomes(&fs);
    assert_eq!(settled.len(), 1, "{settled:?}");
    fs.clear_faults();
    f.sync_data().unwrap();
    assert_eq!(
        outcomes(&fs),
        settled,
        "a later sync changed what a failed one left"
    );
}

#[test]
fn failed_syncs_lose_the_writes_forever() {
    let mut lost = false;
    for seed in 0..40 {
        let fs = disk_with_file();
        fs.set_fault_seed(seed);
        let f = fs.open(p("/d/f"), OpenMode::ReadWrite).unwrap();
        f.write_all_at(b"one", 0).unwrap();
        f.sync_data().unwrap();
        fs.fail_syncs();
        f.write_all_at(b"two", 3).unwrap();
        assert!(f.sync_data().is_err());
        // Readers still see the write (it is in the page cache) ...
        assert_eq!(fs.read_file(p("/d/f")).unwrap(), b"onetwo");
        // ... but what did not reach the disk never will, even after a later sync succeeds.
        fs.clear_faults();
        f.sync_data().unwrap();
        let seen = outcomes(&fs);
        assert_eq!(seen.len(), 1, "{seen:?}");
        lost |= seen[0].as_deref() == Some(b"one");
    }
    assert!(lost, "a failed sync never lost its write");
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

#[test]
fn a_hard_link_shares_the_file_and_is_durable_once_its_directory_is_synced() {
    let fs = disk_with_file();
    let f = fs.open(p("/d/f"), OpenMode::ReadWrite).unwrap();
    f.write_all_at(b"sealed", 0).unwrap();
    f.sync_data().unwrap();
    fs.create_dir_all(p("/e")).unwrap();
    fs.sync_dir(p("/")).unwrap();
    fs.hard_link(p("/d/f"), p("/e/g")).unwrap();
    assert_eq!(
        fs.hard_link(p("/d/f"), p("/e/g")).unwrap_err().kind(),
        io::ErrorKind::AlreadyExists
    );
    assert_eq!(
        fs.hard_link(p("/d/missing"), p("/e/h")).unwrap_err().kind(),
        io::ErrorKind::NotFound
    );
    assert_eq!(fs.read_file(p("/e/g")).unwrap(), b"sealed");
    let seen = outcomes_of(&fs, "/e/g");
    assert!(seen.contains(&None), "an unsynced link always survived");
    assert!(seen.contains(&Some(b"sealed".to_vec())), "{seen:?}");
    assert_eq!(outcomes(&fs), vec![Some(b"sealed".to_vec())]);
    fs.sync_dir(p("/e")).unwrap();
    assert_eq!(outcomes_of(&fs, "/e/g"), vec![Some(b"sealed".to_vec())]);
    // One file under two names: a write through one shows through the other, and survives a
    // crash under both.
    let g = fs.open(p("/e/g"), OpenMode::ReadWrite).unwrap();
    g.write_all_at(b"S", 0).unwrap();
    g.sync_data().unwrap();
    assert_eq!(fs.read_file(p("/d/f")).unwrap(), b"Sealed");
    for seed in 0..SEEDS {
        let image = fs.crash(seed);
        assert_eq!(image.read_file(p("/d/f")).unwrap(), b"Sealed");
        assert_eq!(image.read_file(p("/e/g")).unwrap(), b"Sealed");
    }
    // Removing one name keeps the other.
    fs.remove(p("/d/f")).unwrap();
    fs.sync_dir(p("/d")).unwrap();
    assert_eq!(outcomes_of(&fs, "/e/g"), vec![Some(b"Sealed".to_vec())]);
}

#[test]
fn a_renamed_directory_takes_its_contents_and_is_durable_once_its_parent_is_synced() {
    let fs = FaultFs::new();
    fs.create_dir_all(p("/p/tmp/sub")).unwrap();
    let f = fs.open(p("/p/tmp/sub/f"), OpenMode::CreateNew).unwrap();
    f.write_all_at(b"whole", 0).unwrap();
    f.sync_data().unwrap();
    for dir in ["/p/tmp/sub", "/p/tmp", "/p", "/"] {
        fs.sync_dir(p(dir)).unwrap();
    }
    fs.create_dir_all(p("/p/other")).unwrap();
    assert_eq!(
        fs.rename(p("/p/tmp"), p("/p/other")).unwrap_err().kind(),
        io::ErrorKind::IsADirectory
    );
    assert_eq!(
        fs.rename(p("/p/tmp"), p("/p/tmp/sub/x"))
            .unwrap_err()
            .kind(),
        io::ErrorKind::InvalidInput
    );
    fs.rename(p("/p/tmp"), p("/p/dest")).unwrap();
    assert_eq!(fs.kind(p("/p/tmp")).unwrap(), None);
    assert_eq!(fs.read_file(p("/p/dest/sub/f")).unwrap(), b"whole");
    assert_eq!(fs.list(p("/p")).unwrap(), vec!["dest", "other"]);
    // Within one directory the rename is atomic: a crash leaves the old name or the new one.
    let (mut old, mut new) = (false, false);
    for seed in 0..SEEDS {
        let image = fs.crash(seed);
        let at_old = image.read_file(p("/p/tmp/sub/f"));
        let at_new = image.read_file(p("/p/dest/sub/f"));
        assert!(
            at_old.is_some() != at_new.is_some(),
            "seed {seed}: {at_old:?} {at_new:?}"
        );
        assert_eq!(at_old.or(at_new).unwrap(), b"whole");
        old |= image.kind(p("/p/tmp")).unwrap().is_some();
        new |= image.kind(p("/p/dest")).unwrap().is_some();
    }
    assert!(old && new, "an unsynced rename always or never survived");
    fs.sync_dir(p("/p")).unwrap();
    assert_eq!(
        outcomes_of(&fs, "/p/dest/sub/f"),
        vec![Some(b"whole".to_vec())]
    );
    assert_eq!(outcomes_of(&fs, "/p/tmp/sub/f"), vec![None]);
    // What is made under the new name after the rename lives in the same directory.
    fs.open(p("/p/dest/g"), OpenMode::CreateNew).unwrap();
    fs.sync_dir(p("/p/dest")).unwrap();
    assert_eq!(outcomes_of(&fs, "/p/dest/g"), vec![Some(Vec::new())]);
    assert!(!fs.has_unsynced(), "{:?}", fs.unsynced());
}
