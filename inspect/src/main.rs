//! `portcullis-inspect`: what a store directory holds, and whether every byte of it verifies
//! (SPEC E5). It never changes the directory.
//!
//! ```text
//! portcullis-inspect DIR          files, what open reads, partitions and entities with their
//!                                 sizes, epochs and leases, repair state
//! portcullis-inspect verify DIR   read every record, checksum and checkpoint digest; report
//!                                 damage
//! ```
//!
//! Exit status: 0 when the store was read (and, for `verify`, nothing was found), 1 when
//! `verify` found damage, 2 when the store could not be inspected at all (it is open in another
//! process, it was written by a newer Portcullis, it is not a store directory).

use std::path::PathBuf;
use std::process::ExitCode;

use portcullis::inspect::Inspector;

const USAGE: &str = "usage: portcullis-inspect [verify] DIR

  DIR          print what the store in DIR holds: its files, what open reads, partitions and
               entities with their sizes, the epochs and leases of each namespace, and the
               engine's repair state
  verify DIR   read every journal record and checksum, every row, every entity's digest chain
               and every checkpoint digest, and report any damage

Nothing in DIR is changed. A store that another process has open is refused: close it first.
Exit status: 0 fine, 1 damage found by verify, 2 could not inspect.";

enum Command {
    Summary(PathBuf),
    Verify(PathBuf),
}

fn parse(args: &[String]) -> Option<Command> {
    match args {
        [flag] if flag == "-h" || flag == "--help" => None,
        [verb, dir] if verb == "verify" => Some(Command::Verify(dir.into())),
        [dir] => Some(Command::Summary(dir.into())),
        _ => None,
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(command) = parse(&args) else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let dir = match &command {
        Command::Summary(dir) | Command::Verify(dir) => dir,
    };
    let result = match &command {
        Command::Summary(_) => Inspector::open(dir)
            .and_then(|inspector| inspector.summary())
            .map(|s| {
                print!("{s}");
                ExitCode::SUCCESS
            }),
        Command::Verify(_) => portcullis::inspect::verify(dir).map(|v| {
            print!("{v}");
            if v.is_clean() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }),
    };
    result.unwrap_or_else(|e| {
        eprintln!("portcullis-inspect: cannot inspect {}: {e}", dir.display());
        ExitCode::from(2)
    })
}
