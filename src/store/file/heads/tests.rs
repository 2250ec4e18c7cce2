//! The paged index on its own: several index pages, each read on first use; a damaged one
//! refuses exactly its span; the earlier layout (index in the meta) is still read and the next
//! snapshot written over it has the paged index.

use std::path::Path;

use super::super::fault::FaultFs;
use super::{Heads, Index, PAGE_LEN, PAGES_AT, Pages, Position, open, write, writer};
use crate::error::Error;

/// Long names, so few fit a page and a few thousand partitions need several index pages
/// (about 62 entries a data page, 63 first names an index page).
fn name(i: u32) -> Box<[u8]> {
    format!("{i:08}/{}", "n".repeat(240)).into_bytes().into()
}

fn entries(n: u32) -> Vec<(Box<[u8]>, u64)> {
    (0..n).map(|i| (name(2 * i), u64::from(i) + 1)).collect()
}

fn opened(fs: &FaultFs, file: &str) -> Pages {
    let opened = open(fs, Path::new("/"), file).unwrap().unwrap();
    match opened.heads {
        Heads::Paged(pages) => pages,
        Heads::Listed(_) => panic!("a paged snapshot read whole"),
    }
}

/// Every entry is found, every name between two is absent, and a prefix lists its run.
fn check(pages: &Pages, n: u32) {
    for (i, (name, head)) in entries(n).iter().enumerate() {
        assert_eq!(pages.lookup(name).unwrap(), Some(*head), "entry {i}");
        assert_eq!(
            pages.lookup(&self::name(2 * i as u32 + 1)).unwrap(),
            None,
            "{i}"
        );
    }
    let mut listed = 0;
    pages
        .for_each_prefixed(b"0000", |_, _| listed += 1)
        .unwrap();
    // Names 00000000 to 00009998, even only.
    assert_eq!(listed, 5_000.min(n));
    let names: Vec<Box<[u8]>> = (0..2 * n + 2).map(name).collect();
    let sorted: Vec<&[u8]> = names.iter().map(|n| &**n).collect();
    let found = pages.contains_sorted(&sorted);
    assert!(
        found
            .iter()
            .enumerate()
            .all(|(i, &f)| f == (i % 2 == 0 && i < 2 * n as usize))
    );
}

const N: u32 = 10_000;

fn written(fs: &FaultFs) -> Pages {
    let position = Position::default();
    write(fs, Path::new("/"), "snap", &position, None, &entries(N)).unwrap();
    opened(fs, "snap")
}

#[test]
fn several_index_pages_are_read_on_first_use() {
    let fs = FaultFs::new();
    let pages = written(&fs);
    let Index::Paged(paged) = &pages.index else {
        panic!("the index is not paged");
    };
    assert!(
        paged.starts.len() >= 3,
        "{} index pages",
        paged.starts.len()
    );
    assert!(
        (0..paged.starts.len()).all(|j| !paged.is_loaded(j)),
        "open read an index page"
    );
    assert_eq!(pages.lookup(&name(0)).unwrap(), Some(1));
    assert!(
        paged.is_loaded(0) && !paged.is_loaded(1),
        "one lookup, one index page"
    );
    check(&pages, N);
    assert_eq!(
        super::verify(&fs, Path::new("/"), "snap")
            .unwrap()
            .unwrap()
            .segment,
        0
    );
}

/// The index page of `j` of file `file`: where it starts.
fn index_page_at(fs: &FaultFs, file: &str, j: usize) -> usize {
    let pages = opened(fs, file);
    let Index::Paged(paged) = &pages.index else {
        panic!("the index is not paged");
    };
    PAGES_AT as usize + (paged.data_pages as usize + j) * PAGE_LEN
}

#[test]
fn a_damaged_index_page_refuses_exactly_its_span() {
    let fs = FaultFs::new();
    drop(written(&fs));
    let at = index_page_at(&fs, "snap", 1);
    let mut bytes = fs.read_file(Path::new("/snap")).unwrap();
    // The last byte of the second entry's name: the first name of a data page.
    let second = at + 6 + 1 + bytes[at + 6] as usize;
    let last = second + bytes[second] as usize;
    bytes[last] ^= 0x01;
    fs.write_file(Path::new("/snap"), bytes).unwrap();
    let pages = opened(&fs, "snap");
    let Index::Paged(paged) = &pages.index else {
        panic!("the index is not paged");
    };
    let (from, to) = (paged.root.get(1).to_vec(), paged.root.get(2).to_vec());
    let mut refused = 0;
    for (name, head) in entries(N) {
        match pages.lookup(&name) {
            Ok(found) => {
                assert!(*name < *from || *name >= *to);
                assert_eq!(found, Some(head));
            }
            Err(Error::Corrupt { what, .. }) => {
                assert!(what.contains("index page 1"), "{what}");
                assert!(*name >= *from && *name < *to);
                refused += 1;
            }
            Err(e) => panic!("{e:?}"),
        }
    }
    assert!(refused > 0);
    assert!(pages.any_damaged());
    assert!(pages.describe_damage()[0].contains("index page 1"));
    // Names it could hold are not answered as absent.
    let inside: Vec<&[u8]> = vec![&from];
    assert_eq!(pages.contains_sorted(&inside), vec![true]);
    assert!(pages.for_each_prefixed(b"", |_, _| {}).is_err());

    // Negative control: unchecked, the index page sends a lookup to the wrong data page.
    #[cfg(feature = "test-hooks")]
    {
        let pages = opened(&fs, "snap");
        pages
            .unchecked
            .store(true, crate::sync::atomic::Ordering::Relaxed);
        let lost = entries(N)
            .iter()
            .filter(|(name, _)| matches!(pages.lookup(name), Ok(None)))
            .count();
        assert!(lost > 0, "an unchecked index page lost nothing");
    }
}

#[test]
fn the_earlier_layout_is_read_and_the_next_snapshot_pages_its_index() {
    let fs = FaultFs::new();
    let position = Position {
        next_lsn: 7,
        ..Position::default()
    };
    writer::write_flat(&fs, Path::new("/"), "flat", &position, &entries(N)).unwrap();
    let opened_flat = open(&fs, Path::new("/"), "flat").unwrap().unwrap();
    assert_eq!(opened_flat.position.next_lsn, 7);
    let Heads::Paged(flat) = opened_flat.heads else {
        panic!("read whole");
    };
    assert!(matches!(flat.index, Index::Flat(_)));
    check(&flat, N);
    // A snapshot over it, with one head changed and one added.
    let changed = vec![(name(2), 99), (name(3), 100)];
    write(
        &fs,
        Path::new("/"),
        "next",
        &position,
        Some(&flat),
        &changed,
    )
    .unwrap();
    let next = opened(&fs, "next");
    assert!(matches!(next.index, Index::Paged(_)));
    assert_eq!(next.partitions(), u64::from(N) + 1);
    assert_eq!(next.lookup(&name(2)).unwrap(), Some(99));
    assert_eq!(next.lookup(&name(3)).unwrap(), Some(100));
    assert_eq!(next.lookup(&name(4)).unwrap(), Some(3));
    // Open reads far less of the paged one.
    let bytes = |f| open(&fs, Path::new("/"), f).unwrap().unwrap().bytes;
    assert!(
        bytes("next") * 10 < bytes("flat"),
        "{} {}",
        bytes("next"),
        bytes("flat")
    );
}

#[test]
fn an_index_page_count_that_does_not_match_the_root_is_damage() {
    let fs = FaultFs::new();
    drop(written(&fs));
    let mut bytes = fs.read_file(Path::new("/snap")).unwrap();
    let fields = super::PREAMBLE_LEN;
    let count = u32::from_le_bytes(bytes[fields + 20..fields + 24].try_into().unwrap());
    bytes[fields + 20..fields + 24].copy_from_slice(&(count - 1).to_le_bytes());
    let crc = crc32c::crc32c(&bytes[fields..fields + 24]);
    bytes[fields + 24..fields + 28].copy_from_slice(&crc.to_le_bytes());
    fs.write_file(Path::new("/snap"), bytes.clone()).unwrap();
    assert!(matches!(
        open(&fs, Path::new("/"), "snap"),
        Err(Error::Corrupt { .. })
    ));
    // A flipped bit in the count without its checksum is damage too.
    bytes[fields + 20] ^= 0x01;
    fs.write_file(Path::new("/snap"), bytes).unwrap();
    assert!(matches!(
        open(&fs, Path::new("/"), "snap"),
        Err(Error::Corrupt { .. })
    ));
}

/// Lookups in name order read each data page once: the page read last is kept, verified, and
/// the next lookup on it costs no read (issue 13: a read of every history looked each
/// partition's head up with a page read, a checksum and a decode).
#[cfg(feature = "test-hooks")]
#[test]
fn lookups_on_the_page_read_last_do_not_read_it_again() {
    use crate::sync::atomic::Ordering;
    let fs = FaultFs::new();
    let pages = written(&fs);
    // 62 entries a data page: entries 0 and 1 share page 0, entry 100 is on page 1.
    let reads = |name: &[u8]| {
        let before = fs.ops();
        assert!(pages.lookup(name).unwrap().is_some());
        fs.ops() - before
    };
    assert!(reads(&name(0)) >= 1, "the first lookup read nothing");
    assert_eq!(reads(&name(2)), 0, "the page read last was read again");
    assert_eq!(reads(&name(200)), 1, "another page was not read");
    assert_eq!(reads(&name(202)), 0);
    // Every answer is the same with the kept page.
    check(&pages, N);
    // Negative control: without the kept page, every lookup reads its page.
    pages.uncached.store(true, Ordering::Relaxed);
    *pages.last.lock() = None;
    assert_eq!(reads(&name(0)), 1);
    assert_eq!(reads(&name(2)), 1, "a lookup did not read its page");
}

/// A snapshot with one index page: open reads it with the meta, in one read, and the first
/// lookup reads only its data page (issue 13: a cold first answer costs its random reads). It
/// is still verified on its first use: damaged, it refuses its span then, not at open.
#[test]
fn a_single_index_page_is_read_with_the_meta() {
    let fs = FaultFs::new();
    write(
        &fs,
        Path::new("/"),
        "snap",
        &Position::default(),
        None,
        &entries(500),
    )
    .unwrap();
    let before = fs.ops();
    let snap = open(&fs, Path::new("/"), "snap").unwrap().unwrap();
    // Open, size, header, header and meta: the index page costs no read of its own.
    let open_ops = fs.ops() - before;
    assert_eq!(snap.index_bytes, PAGE_LEN as u64);
    assert!(
        snap.bytes < 1_000,
        "{} bytes of header and meta",
        snap.bytes
    );
    let Heads::Paged(pages) = snap.heads else {
        panic!("a paged snapshot read whole")
    };
    let before = fs.ops();
    assert_eq!(pages.lookup(&name(0)).unwrap(), Some(1));
    assert_eq!(fs.ops() - before, 1, "the first lookup read the index page");
    assert!(open_ops <= 4, "{open_ops} operations to open");
    check(&pages, 500);

    // Damaged, the index page is refused on first use, as when it is read then.
    let j = index_page_at(&fs, "snap", 0);
    let path = Path::new("/snap");
    let mut bytes = fs.read_file(path).unwrap();
    bytes[j + 100] ^= 0x40;
    fs.write_file(path, bytes).unwrap();
    let pages = opened(&fs, "snap");
    assert!(pages.lookup(&name(0)).is_err());
    assert!(pages.any_damaged());
    assert!(pages.describe_damage()[0].contains("index page 0"));
}
