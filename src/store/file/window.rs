//! [`Window`]: a bounded buffer over a segment file, through which open's journal scan and
//! compaction read records (SPEC S8). A segment of any size, and a record of any size, is read
//! with at most [`WINDOW`] bytes held at once: frames and body heads come from the buffer, and a
//! body's checksum is computed piece by piece as the buffer moves through it.
//!
//! Reading moves forward: the buffer is refilled from the first byte asked for that it does not
//! hold, so a sequential walk reads every byte once. Calls only the file layer.

use std::io;

use super::vfs::VfsFile;

/// Bytes of a segment held at once.
pub const WINDOW: usize = 1 << 20;

/// A window over the first `len` bytes of a file.
pub struct Window<'a> {
    file: &'a dyn VfsFile,
    len: u64,
    /// File offset of `buf[0]`.
    start: u64,
    /// Allocated by the first read, so a window nothing is read through (open's scan of a
    /// store closed cleanly) costs no allocation.
    buf: Vec<u8>,
    /// The buffer's size once allocated.
    cap: usize,
    filled: usize,
}

impl<'a> Window<'a> {
    /// A window over `file`, whose length is taken to be `len`. Allocates at most [`WINDOW`]
    /// bytes (less for a smaller file), on its first read.
    pub fn new(file: &'a dyn VfsFile, len: u64) -> Self {
        Window {
            file,
            len,
            start: 0,
            buf: Vec::new(),
            cap: (len as usize).min(WINDOW),
            filled: 0,
        }
    }

    /// Whether the buffer has been allocated (tests).
    #[cfg(test)]
    pub fn allocated(&self) -> bool {
        !self.buf.is_empty()
    }

    /// The length the window reads up to.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Refills the buffer from `at` unless it holds the byte at `at`.
    fn hold(&mut self, at: u64) -> io::Result<()> {
        if at >= self.start && at < self.start + self.filled as u64 {
            return Ok(());
        }
        self.refill(at)
    }

    fn refill(&mut self, at: u64) -> io::Result<()> {
        if self.buf.len() < self.cap {
            self.buf = vec![0u8; self.cap];
        }
        self.start = at;
        self.filled = (self.len.saturating_sub(at) as usize).min(self.buf.len());
        self.file.read_exact_at(&mut self.buf[..self.filled], at)
    }

    /// Up to `n` bytes (at most [`WINDOW`]) at `at`; fewer only at the end of the file.
    pub fn get(&mut self, at: u64, n: usize) -> io::Result<&[u8]> {
        let n = n.min(self.cap);
        let inside = at >= self.start && at + n as u64 <= self.start + self.filled as u64;
        if !inside {
            self.refill(at)?;
        }
        let from = (at - self.start) as usize;
        let to = (from + n).min(self.filled);
        Ok(&self.buf[from..to])
    }

    /// How many bytes from `at` on are zero (up to the end), checked a buffer at a time: the
    /// unwritten, preallocated end of a segment is skipped at memory speed, never probed byte
    /// by byte.
    pub fn zeros_from(&mut self, at: u64) -> io::Result<u64> {
        let mut pos = at;
        while pos < self.len {
            self.hold(pos)?;
            let from = (pos - self.start) as usize;
            let chunk = &self.buf[from..self.filled];
            if chunk.is_empty() {
                break;
            }
            match first_nonzero(chunk) {
                Some(i) => return Ok(pos + i as u64 - at),
                None => pos += chunk.len() as u64,
            }
        }
        Ok(pos - at)
    }

    /// The crc32c of the `n` bytes at `at`, read a buffer at a time; `None` if the file ends
    /// before them.
    pub fn crc(&mut self, at: u64, n: u64) -> io::Result<Option<u32>> {
        if at.checked_add(n).is_none_or(|end| end > self.len) {
            return Ok(None);
        }
        let mut crc = 0u32;
        let mut done = 0u64;
        while done < n {
            self.hold(at + done)?;
            let from = (at + done - self.start) as usize;
            let to = ((from as u64 + n - done) as usize).min(self.filled);
            if to <= from {
                return Ok(None);
            }
            crc = crc32c::crc32c_append(crc, &self.buf[from..to]);
            done += (to - from) as u64;
        }
        Ok(Some(crc))
    }
}

/// The index of the first non-zero byte, comparing 16 bytes at a time.
fn first_nonzero(bytes: &[u8]) -> Option<usize> {
    let mut wide = bytes.chunks_exact(16);
    let mut skipped = 0;
    for chunk in wide.by_ref() {
        if u128::from_ne_bytes(chunk.try_into().expect("16 bytes")) != 0 {
            break;
        }
        skipped += 16;
    }
    bytes[skipped..]
        .iter()
        .position(|&b| b != 0)
        .map(|i| skipped + i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::file::vfs::{OpenMode, OsFs, Vfs};

    #[test]
    fn reads_and_checksums_across_refills() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let bytes: Vec<u8> = (0..(3 * WINDOW + 123))
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        std::fs::write(&path, &bytes).unwrap();
        let file = OsFs.open(&path, OpenMode::Read).unwrap();
        let mut w = Window::new(&*file, bytes.len() as u64);
        assert_eq!(w.get(5, 10).unwrap(), &bytes[5..15]);
        let near_end = WINDOW as u64 - 3;
        assert_eq!(
            w.get(near_end, 37).unwrap(),
            &bytes[WINDOW - 3..WINDOW + 34]
        );
        for (at, n) in [(0, bytes.len()), (17, 2 * WINDOW + 5), (WINDOW + 1, 1)] {
            let want = crc32c::crc32c(&bytes[at..at + n]);
            assert_eq!(w.crc(at as u64, n as u64).unwrap(), Some(want));
        }
        assert_eq!(w.crc(10, bytes.len() as u64).unwrap(), None);
        let end = bytes.len() as u64;
        assert_eq!(w.get(end - 4, 37).unwrap(), &bytes[bytes.len() - 4..]);
        assert!(w.get(end, 37).unwrap().is_empty());
    }

    #[test]
    fn measures_runs_of_zeros_across_refills() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let mut bytes = vec![0u8; 2 * WINDOW + 100];
        bytes[7] = 1;
        bytes[WINDOW + 33] = 2;
        std::fs::write(&path, &bytes).unwrap();
        let file = OsFs.open(&path, OpenMode::Read).unwrap();
        let mut w = Window::new(&*file, bytes.len() as u64);
        assert_eq!(w.zeros_from(0).unwrap(), 7);
        assert_eq!(w.zeros_from(7).unwrap(), 0);
        assert_eq!(w.zeros_from(8).unwrap(), WINDOW as u64 + 25);
        let after = WINDOW as u64 + 34;
        assert_eq!(w.zeros_from(after).unwrap(), bytes.len() as u64 - after);
        assert_eq!(w.zeros_from(bytes.len() as u64).unwrap(), 0);
    }

    #[test]
    fn a_window_allocates_on_its_first_read_not_before() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![3u8; 2 * WINDOW]).unwrap();
        let file = OsFs.open(&path, OpenMode::Read).unwrap();
        let mut w = Window::new(&*file, 2 * WINDOW as u64);
        assert!(!w.allocated(), "open's scan of a clean store reads nothing");
        assert_eq!(w.get(1, 2).unwrap(), &[3, 3]);
        assert!(w.allocated());
    }
}
