//! `portcullis-inspect`: what a store directory holds, and whether every byte of it verifies
//! (SPEC E5); and a backup of a store no process has open (SPEC S12). It never changes the
//! store's directory.
//!
//! ```text
//! portcullis-inspect DIR          files, what open reads, partitions and entities with their
//!                                 sizes, epochs and leases, repair state
//! portcullis-inspect verify DIR   read every record, checksum and checkpoint digest; report
//!                                 damage
//! portcullis-inspect backup SRC DEST
//!                                 copy the store in SRC to the new directory DEST (SPEC S12),
//!                                 linking sealed segments where the file system allows
//! ```
//!
//! `--help` prints the usage and exits 0. Exit status: 0 when the store was read (and, for
//! `verify`, nothing was found; for `backup`, the backup was written), 1 when `verify` found
//! damage, 2 when the store could not be inspected or backed up at all (it is open in another
//! process, it was written by a newer Portcullis, it is not a store directory, DEST exists) or
//! the invocation was wrong.

use std::path::PathBuf;
use std::process::ExitCode;

use portcullis::inspect::Inspector;

const USAGE: &str = "usage: portcullis-inspect [verify] DIR
       portcullis-inspect backup SRC DEST

  DIR              print what the store in DIR holds: its files, what open reads, partitions
                   and entities with their sizes, the epochs and leases of each namespace, and
                   the engine's repair state
  verify DIR       read every journal record and checksum, every row, every entity's digest
                   chain and every checkpoint digest, and report any damage
  backup SRC DEST  copy the store in SRC to DEST, a directory that must not exist yet: the
                   copy opens as an ordinary store; sealed journal segments are hard-linked
                   where the file system allows (copy DEST elsewhere to survive losing the disk)

Nothing in DIR or SRC is changed. A store that another process has open is refused: close it
first, or back it up from that process (FileStore::backup, Engine::backup).
Exit status: 0 fine (and for --help), 1 damage found by verify, 2 could not inspect or back
up, or a wrong invocation.";

enum Command {
    Help,
    Summary(PathBuf),
    Verify(PathBuf),
    Backup(PathBuf, PathBuf),
}

fn parse(args: &[String]) -> Option<Command> {
    match args {
        [flag] if flag == "-h" || flag == "--help" => Some(Command::Help),
        [verb, dir] if verb == "verify" => Some(Command::Verify(dir.into())),
        [verb, src, dest] if verb == "backup" => Some(Command::Backup(src.into(), dest.into())),
        [dir] => Some(Command::Summary(dir.into())),
        _ => None,
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut what = "inspect";
    let (dir, outcome) = match parse(&args) {
        // Asked for: the usage on standard output, and success.
        Some(Command::Help) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        // A wrong invocation: the usage on standard error, and status 2.
        None => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
        Some(Command::Summary(dir)) => {
            let summary = Inspector::open(&dir).and_then(|inspector| inspector.summary());
            let outcome = summary.map(|s| {
                print!("{s}");
                ExitCode::SUCCESS
            });
            (dir, outcome)
        }
        Some(Command::Verify(dir)) => {
            let outcome = portcullis::inspect::verify(&dir).map(|v| {
                print!("{v}");
                match v.is_clean() {
                    true => ExitCode::SUCCESS,
                    false => ExitCode::from(1),
                }
            });
            (dir, outcome)
        }
        Some(Command::Backup(src, dest)) => {
            what = "back up";
            let outcome = portcullis::inspect::backup(&src, &dest).map(|r| {
                println!(
                    "backed up {} to {}: {} files linked ({} bytes), {} copied ({} bytes) in {:?}",
                    src.display(),
                    dest.display(),
                    r.files_linked,
                    r.bytes_linked,
                    r.files_copied,
                    r.bytes_copied,
                    r.elapsed
                );
                ExitCode::SUCCESS
            });
            (src, outcome)
        }
    };
    outcome.unwrap_or_else(|e| {
        eprintln!("portcullis-inspect: cannot {what} {}: {e}", dir.display());
        ExitCode::from(2)
    })
}
