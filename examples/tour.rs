//! A tour of Portcullis on a temporary directory: `cargo run --release --example tour`.
//! It ends by pointing at the README's engine quick-start, `examples/handover.rs`,
//! `examples/chat.rs` and the `portcullis-inspect` tool.
//!
//! It builds a store with history, opens an engine over it at once, restores one entity on
//! its first touch, warms the rest in the background, fences a stale writer when a second
//! engine takes its namespace over, kills a process in the middle of its writes and shows the unclean-restart repair
//! applied exactly once, and closes. Every number it prints is measured, and every claim it
//! makes is checked: the tour panics rather than tell a story that did not happen.
//!
//! For the crash, the tour re-executes itself as a writer (selected by an environment
//! variable) and kills that child with SIGKILL. `tests/tour.rs` runs the same steps on a small
//! store.

use std::io::{BufRead, BufReader, Lines};
use std::path::Path;
use std::process::{ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use portcullis::engine::{Engine, TakeOver};
use portcullis::restore::{ApplyContext, Metrics, UnitReport};
use portcullis::store::{Batch, FileStore, OpenReport, Outcome, Store, SyncPolicy};
use portcullis::{EntityId, Error, Rejection, Result, StateMachine};
use serde::{Deserialize, Serialize};

/// Set (to the store's directory) in the child process that writes until it is killed.
pub const WRITER_ENV: &str = "PORTCULLIS_TOUR_WRITER_DIR";

/// How much history the tour builds.
#[derive(Clone, Copy, Debug)]
pub struct Scale {
    /// Chat rooms (entities).
    pub rooms: usize,
    /// Messages (log records) per room.
    pub messages: usize,
}

impl Scale {
    /// The size `cargo run --example tour` uses: a million records.
    pub const TOUR: Scale = Scale {
        rooms: 20_000,
        messages: 50,
    };
}

/// The room touched first, then fenced.
const FIRST_TOUCH: usize = 7;
/// The rooms the killed child writes to.
const CHILD_WRITES_TO: [usize; 2] = [1, 2];
/// A room the child never touches: it is repaired after the crash all the same.
const UNTOUCHED_BY_CHILD: usize = 3;
/// Acknowledged writes the parent waits to see before it kills the child.
const KILL_AFTER_ACKS: usize = 2;

#[allow(dead_code)] // `main` is unused when `tests/tour.rs` includes this file as a module.
fn main() -> Result<()> {
    if let Some(dir) = std::env::var_os(WRITER_ENV) {
        return keep_writing(Path::new(&dir));
    }
    let started = Instant::now();
    let dir = tempfile::tempdir().map_err(|e| io("creating a temporary directory", e))?;
    run(dir.path(), Scale::TOUR, &|| {
        Ok(Command::new(std::env::current_exe()?))
    })?;
    println!("\nThe whole tour took {:.1?}.", started.elapsed());
    println!(
        "\nNext: the engine quick-start in README.md (a serde state machine: open, register, \
         write, read, checkpoint, restart, warm, close); `cargo run --example handover` (two \
         owners hand a namespace over under epoch fencing); `cargo run --example chat` (eight \
         writer threads, a restart and a warm); `cargo run -p portcullis-inspect -- DIR` and \
         `... -- verify DIR` (what a store holds, and whether every checksum verifies)."
    );
    Ok(())
}

/// Runs every step of the tour on `dir`. `relaunch` builds the command that starts a copy of
/// this program; the tour adds the environment variable that makes it the writer child.
pub fn run(
    dir: &Path,
    scale: Scale,
    relaunch: &dyn Fn() -> std::io::Result<Command>,
) -> Result<()> {
    println!(
        "Portcullis tour: {} chat rooms x {} messages\n",
        count(scale.rooms),
        count(scale.messages)
    );
    build_history(dir, scale)?;
    let engine = open_at_once(dir)?;
    touch_one_room(&engine, scale)?;
    warm_the_rest(&engine, scale)?;
    fence_a_stale_writer(&engine)?;
    let engine = kill_a_writer_and_reopen(engine, dir, relaunch)?;
    close_cleanly(engine)
}

// ---------------------------------------------------------------------------------------------
// The application: chat rooms.

/// The state the engine restores for each room.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Room {
    /// Messages folded so far.
    pub messages: u64,
    /// The crashed incarnations this room was repaired for, one entry per repair record.
    pub repairs: Vec<u64>,
}

/// What the application's callbacks answer: a value, or a refusal in its own words.
type Refusable<T> = std::result::Result<T, Rejection>;

/// The record the repair appends: the unclean incarnation, so a duplicate would show.
const REPAIR_PREFIX: &[u8] = b"repaired after the crash of incarnation ";

enum Record {
    Message,
    Repair(u64),
}

impl Record {
    fn parse(bytes: &[u8]) -> Refusable<Record> {
        if bytes.starts_with(b"msg ") {
            return Ok(Record::Message);
        }
        let incarnation = bytes
            .strip_prefix(REPAIR_PREFIX)
            .and_then(|n| std::str::from_utf8(n).ok()?.parse().ok())
            .ok_or_else(|| Rejection::new("neither a message nor a repair record"))?;
        Ok(Record::Repair(incarnation))
    }
}

fn message(text: impl std::fmt::Display) -> Vec<u8> {
    format!("msg {text}").into_bytes()
}

/// Folds messages into a count; its unclean-restart repair appends one marker record.
struct ChatRooms;

impl StateMachine for ChatRooms {
    type State = Room;

    fn fresh(&self, _: &EntityId) -> Room {
        Room::default()
    }

    fn apply(&self, room: &mut Room, _: &ApplyContext<'_>, record: &[u8]) -> Refusable<()> {
        match Record::parse(record)? {
            Record::Message => room.messages += 1,
            Record::Repair(incarnation) => room.repairs.push(incarnation),
        }
        Ok(())
    }

    fn encode_checkpoint(&self, room: &Room) -> Result<Vec<u8>, Rejection> {
        postcard::to_stdvec(room)
            .map_err(|e| Rejection::new(format!("a room that does not encode: {e}")))
    }

    fn decode_checkpoint(&self, _: &EntityId, bytes: &[u8]) -> Refusable<Room> {
        postcard::from_bytes(bytes).map_err(|e| Rejection::new(format!("bad checkpoint: {e}")))
    }

    fn validate(&self, record: &[u8]) -> Refusable<()> {
        Record::parse(record).map(|_| ())
    }

    // A real application would, say, close sessions the crash left open. The tour appends a
    // marker so that "exactly once" can be seen in the state.
    fn repair(&self, _: &EntityId, _: &Room, unclean: u64) -> Refusable<Vec<Vec<u8>>> {
        let mut marker = REPAIR_PREFIX.to_vec();
        marker.extend_from_slice(unclean.to_string().as_bytes());
        Ok(vec![marker])
    }
}

fn room(i: usize) -> EntityId {
    EntityId::new("chat", format!("room-{i:05}")).expect("a valid entity id")
}

/// Remembers what restore units did, through the engine's metrics hook (SPEC R9).
#[derive(Default)]
struct RestoreWatch {
    last: Mutex<Option<UnitReport>>,
    repair_records: AtomicU64,
}

impl Metrics for RestoreWatch {
    fn entity_restored(&self, _: &EntityId, report: &UnitReport) {
        self.repair_records
            .fetch_add(report.repaired, Ordering::Relaxed);
        *self.last.lock() = Some(report.clone());
    }
}

/// An engine, with the watch on its restores.
struct Opened {
    engine: Engine<ChatRooms>,
    watch: Arc<RestoreWatch>,
    /// The store the tour opened and handed to the engine: its lifetime is the tour's, so the
    /// tour closes it after the engine.
    store: Arc<FileStore>,
}

impl Opened {
    fn close(&self) -> Result<()> {
        self.engine.close()?;
        self.store.close()
    }
}

/// Opens the engine over the file store in `dir`, and says what the store's open read.
fn open_engine(dir: &Path) -> Result<(Opened, OpenReport)> {
    let store = Arc::new(FileStore::open(dir)?);
    let report = store.open_report().clone();
    let watch = Arc::new(RestoreWatch::default());
    // Many warm workers: each restore that repairs appends durably, and concurrent appends
    // share syncs (group commit), so more workers than cores pays off. The background warm (on
    // by default) would start restoring rooms as soon as the first touch adopts the namespace;
    // off here, so the tour shows the first touch alone, then a warm of the rest.
    let engine = Engine::builder(ChatRooms)
        .store(Arc::clone(&store) as Arc<dyn Store>)
        .metrics(Arc::clone(&watch) as Arc<dyn Metrics>)
        .pool_threads(32)
        .warm_parallelism(32)
        .background_warm(false)
        .open()?;
    Ok((
        Opened {
            engine,
            watch,
            store,
        },
        report,
    ))
}

// ---------------------------------------------------------------------------------------------
// 1. History.

fn build_history(dir: &Path, scale: Scale) -> Result<()> {
    println!("1. Build a store with history");
    let started = Instant::now();
    // A bulk import we could redo if it crashed: no sync per batch. The store still syncs at
    // close, and no policy can ever expose half a batch.
    let store = Arc::new(
        FileStore::builder(dir)
            .sync_policy(SyncPolicy::NeverSyncMayLoseRecent)
            .open()?,
    );
    let engine = Engine::builder(ChatRooms)
        .store(Arc::clone(&store) as Arc<dyn Store>)
        .open()?;
    for i in 0..scale.rooms {
        let room = room(i);
        engine.register(&room)?;
        // Each room's history goes into its log in one batch, through the log layer: the
        // engine's own writes are fenced, and each would take an epoch lease that an import
        // does not need. Nothing is restored while we do this; every room stays pending.
        let messages: Vec<Vec<u8>> = (1..=scale.messages)
            .map(|n| message(format_args!("{n} in {room}: hello")))
            .collect();
        let appended =
            portcullis::log::append(&*store, &room.partition(), &messages, Batch::new())?;
        assert!(
            appended.committed().is_some(),
            "nothing else writes these logs"
        );
    }
    let claims = claim_a_room_twice(&*store)?;
    let batches = store.stats().batches;
    engine.close()?;
    store.close()?;
    println!(
        "   {} records in {} batches, {:.1} MiB on disk, written in {:.2?}",
        count(scale.rooms * scale.messages),
        count(batches),
        mib(disk_bytes(dir)),
        started.elapsed()
    );
    println!(
        "   two guarded batches claim {}'s owner row: {:?}, then {:?}",
        room(0),
        claims.0,
        claims.1
    );
    Ok(())
}

/// The store's own primitive (SPEC S2): a batch whose guards are checked and whose operations
/// are applied atomically. Two writers both claim a room's free `owner` row; one wins.
fn claim_a_room_twice(store: &dyn Store) -> Result<(Outcome, Outcome)> {
    let p = room(0).partition();
    let claim = |who: &str| {
        Batch::new()
            .absent(b"owner".to_vec())
            .put(b"owner".to_vec(), who)
    };
    let first = store.apply(&p, &claim("alice"))?;
    let second = store.apply(&p, &claim("bob"))?;
    assert_eq!(second, Outcome::PreconditionFailed { index: 0 });
    Ok((first, second))
}

fn disk_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|entry| match entry.metadata() {
            Ok(m) if m.is_dir() => disk_bytes(&entry.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// `1234567` as `1,234,567`.
fn count(n: impl TryInto<u64>) -> String {
    let digits = n.try_into().unwrap_or(u64::MAX).to_string();
    let mut out = String::new();
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(d);
    }
    out
}

fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

// ---------------------------------------------------------------------------------------------
// 2. Open reads no history (SPEC S5, R1).

fn open_at_once(dir: &Path) -> Result<Opened> {
    println!("\n2. Open the engine");
    let started = Instant::now();
    let (opened, report) = open_engine(dir)?;
    let took = started.elapsed();
    let stats = opened.engine.stats();
    println!(
        "   ready in {took:.1?}: the store read a {:.1} MiB heads snapshot and {} journal bytes, no history",
        mib(report.snapshot_bytes),
        report.journal_bytes_scanned
    );
    println!(
        "   {} rooms pending, {} restored, {} restore units run",
        count(stats.phases.pending),
        stats.phases.restored,
        stats.units_run
    );
    assert_eq!(
        (stats.phases.restored, stats.units_run),
        (0, 0),
        "open restores nothing"
    );
    Ok(opened)
}

// ---------------------------------------------------------------------------------------------
// 3. The first touch restores one room (SPEC R2, R3).

fn touch_one_room(opened: &Opened, scale: Scale) -> Result<()> {
    println!("\n3. Touch one room");
    let first = room(FIRST_TOUCH);
    let started = Instant::now();
    let messages = opened.engine.read(&first, |room| room.messages)?;
    let took = started.elapsed();
    let unit = opened
        .watch
        .last
        .lock()
        .clone()
        .expect("the read ran a restore unit");
    println!(
        "   reading {first} restored it: {} records replayed in {:.1?} (the whole read: {took:.1?}); it holds {messages} messages",
        unit.replayed, unit.elapsed
    );
    let stats = opened.engine.stats();
    println!(
        "   restored: {}, still pending: {}",
        stats.phases.restored,
        count(stats.phases.pending)
    );
    assert_eq!(messages, scale.messages as u64);
    assert_eq!(stats.phases.restored, 1);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 4. A background warm restores the rest (SPEC R6).

fn warm_the_rest(opened: &Opened, scale: Scale) -> Result<()> {
    println!("\n4. Warm the rest in the background");
    let warm = opened.engine.warm()?;
    // A line per quarter of the way, not per room.
    let mut quarters_shown = 0;
    loop {
        let finished = warm.wait_timeout(Duration::from_millis(10));
        let p = warm.progress();
        let quarters = if finished {
            4
        } else {
            p.done * 4 / p.total.max(1)
        };
        if quarters > quarters_shown {
            quarters_shown = quarters;
            println!(
                "   warm: {:>6} / {} done, {} refused, {:.2?}",
                count(p.done),
                count(p.total),
                p.refused,
                p.elapsed
            );
        }
        if finished {
            break;
        }
    }
    let stats = opened.engine.stats();
    println!(
        "   restored: {}, pending: {}, restore units run: {}",
        count(stats.phases.restored),
        stats.phases.pending,
        count(stats.units_run)
    );
    assert_eq!(stats.phases.restored, scale.rooms as u64);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 5. Epoch fencing and a take-over (SPEC F1-F7, F12).

fn fence_a_stale_writer(opened: &Opened) -> Result<()> {
    println!("\n5. Fence a stale writer");
    let engine = &opened.engine;
    // A namespace of its own, so revocation has one live lease to push: in `chat`, every room
    // registered or written in this run holds one, and each slice pushes at most four (F4).
    let target = EntityId::new("moderation", "queue").expect("a valid entity id");
    let ns = target.namespace();
    // The engine serves the namespace under the grant it adopted (SPEC F11): every write it
    // makes there commits through the fence under that grant.
    let grant = engine.own(ns)?;
    engine.register(&target)?;
    let seqs = engine.append(&target, vec![message("written under the first grant")])?;
    println!(
        "   the engine serves {} under grant {grant} and appends to {target}: committed at seq {}",
        ns.as_str(),
        seqs.start()
    );

    // A second engine over the same store, with an owner id of its own: a standby that takes
    // the namespace over (SPEC F12). A router would ask any engine who serves a namespace.
    let standby = Engine::builder(ChatRooms)
        .store(Arc::clone(&opened.store) as Arc<dyn Store>)
        .owner("standby")
        .adopt_on_first_use(false)
        .pool_threads(1)
        .open()?;
    let holder = standby
        .owner_of(ns)?
        .expect("the engine adopted the namespace");
    println!(
        "   a standby engine asks who serves {}: owner {:?}, incarnation {}, epoch {}, live: {}",
        ns.as_str(),
        holder.owner,
        holder.incarnation,
        holder.epoch,
        holder.live
    );
    assert!(holder.serves() && holder.owner == engine.owner());
    let refused = standby
        .take_over(ns, TakeOver::new())
        .expect_err("a live owner is not taken for a crash");
    assert!(matches!(refused, Error::OwnerLive { .. }));
    println!("   it may not take the namespace from a live owner unless it forces it:");
    println!("     code {}: {refused}", refused.code());

    // Forced: one call bumps the epoch, revokes until Complete (every live lease pushed the
    // new epoch, F5, F7) and adopts the namespace on that proof.
    let fence_before = standby.fence().stats();
    let started = Instant::now();
    let newer = standby.take_over(ns, TakeOver::new().force(true))?;
    let took = started.elapsed();
    let fence = standby.fence().stats();
    println!(
        "   forced, take_over bumps {} to epoch {newer}, revokes to Complete ({} in {}, {} and \
         {}) and adopts it, in {took:.1?}",
        ns.as_str(),
        plural(fence.slices - fence_before.slices, "slice", "slices"),
        plural(
            fence.store_calls - fence_before.store_calls,
            "store call",
            "store calls"
        ),
        plural(fence.pushes - fence_before.pushes, "push", "pushes"),
        plural(
            fence.acks - fence_before.acks,
            "acknowledgement",
            "acknowledgements"
        ),
    );
    assert!(
        fence.pushes > fence_before.pushes,
        "the live lease was pushed"
    );

    let refused = engine
        .append(&target, vec![message("still under the old grant")])
        .expect_err("a write under an older epoch must not commit after Complete");
    println!("   the first engine, still holding grant {grant}, writes again and is refused:");
    println!("     code {}: {refused}", refused.code());
    assert!(matches!(refused, Error::Fenced { .. }));
    // Deposed: it stops serving the namespace at once, answering from memory.
    let again = engine.read(&target, |_| ()).unwrap_err();
    assert!(matches!(again, Error::Fenced { .. }));
    println!("   from now on it answers Fenced without asking the store, until it adopts again");

    // The standby hands the namespace back cleanly: it releases it, the first engine adopts it.
    standby.release_namespace(ns)?;
    let adopted = engine.own(ns)?;
    let seqs = engine.append(&target, vec![message("written under the new grant")])?;
    println!(
        "   the standby releases it; the first engine adopts it again under grant {adopted}: \
         committed at seq {}",
        seqs.start()
    );
    standby.close()?;
    println!("   (two engines handing a namespace over: cargo run --example handover)");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 6. A writer killed mid-flight, and the repair that follows (SPEC S4, R3).

/// Starts each line the writer child reports, so the parent can find it among other output.
const CHILD_SAYS: &str = "tour-writer: ";

/// Child mode: opens the engine on `dir` and appends to two rooms, reporting `open <incarnation>`
/// and then one `ack <room>` per durable write on stdout, until it is killed. It gives up on its
/// own after a while, so that a parent that died first leaves no writer behind.
pub fn keep_writing(dir: &Path) -> Result<()> {
    use std::io::Write;
    let engine = Engine::builder(ChatRooms).directory(dir).open()?;
    let mut out = std::io::stdout().lock();
    let say = |out: &mut std::io::StdoutLock, line: String| -> Result<()> {
        writeln!(out, "{CHILD_SAYS}{line}")
            .and_then(|()| out.flush())
            .map_err(|e| io("reporting to the parent", e))
    };
    say(&mut out, format!("open {}", engine.incarnation()))?;
    let give_up = Instant::now() + Duration::from_secs(20);
    for n in 0.. {
        if Instant::now() > give_up {
            break;
        }
        let i = CHILD_WRITES_TO[n % CHILD_WRITES_TO.len()];
        engine.append(&room(i), vec![message(format_args!("{n} from the child"))])?;
        // Written under the default sync policy: acknowledged means durable.
        say(&mut out, format!("ack {i}"))?;
    }
    engine.close()
}

/// What the parent saw of the child.
#[derive(Default)]
struct ChildReport {
    incarnation: u64,
    acks: [u64; CHILD_WRITES_TO.len()],
}

impl ChildReport {
    /// Takes one line of the child's stdout; other output (a test harness's) is ignored.
    fn take(&mut self, line: &str) -> bool {
        let Some(at) = line.find(CHILD_SAYS) else {
            return false;
        };
        let line = &line[at + CHILD_SAYS.len()..];
        if let Some(n) = line.strip_prefix("open ") {
            self.incarnation = n.trim().parse().unwrap_or(0);
        } else if let Some(i) = line.strip_prefix("ack ") {
            let i: usize = i.trim().parse().unwrap_or(usize::MAX);
            if let Some(k) = CHILD_WRITES_TO.iter().position(|&r| r == i) {
                self.acks[k] += 1;
                return true;
            }
        }
        false
    }

    fn total(&self) -> u64 {
        self.acks.iter().sum()
    }
}

fn kill_a_writer_and_reopen(
    before: Opened,
    dir: &Path,
    relaunch: &dyn Fn() -> std::io::Result<Command>,
) -> Result<Opened> {
    println!("\n6. Kill a writer, reopen, repair");
    // The two rooms the child writes to, and one it never touches.
    let rooms: Vec<usize> = CHILD_WRITES_TO
        .iter()
        .copied()
        .chain([UNTOUCHED_BY_CHILD])
        .collect();
    let messages_before = rooms
        .iter()
        .map(|&i| before.engine.read(&room(i), |r| r.messages))
        .collect::<Result<Vec<_>>>()?;
    // One process owns a directory (SPEC S6): close so that the child can open it.
    before.close()?;

    let child = run_child_until_killed(dir, relaunch)?;
    println!(
        "   a child process (incarnation {}) opened the store and wrote to {} and {}",
        child.incarnation,
        room(CHILD_WRITES_TO[0]),
        room(CHILD_WRITES_TO[1]),
    );
    println!(
        "   after {KILL_AFTER_ACKS} acknowledged writes it got SIGKILL ({} acknowledged in all)",
        child.total()
    );

    let after = reopen_after_the_crash(dir, &child, &rooms, &messages_before)?;
    after.close()?;
    reopen_cleanly(dir, &rooms)
}

/// Reopens after the kill: each room touched is repaired once, as part of its restore.
fn reopen_after_the_crash(
    dir: &Path,
    child: &ChildReport,
    rooms: &[usize],
    messages_before: &[u64],
) -> Result<Opened> {
    let (after, _) = open_engine(dir)?;
    let engine = &after.engine;
    println!(
        "   reopened as incarnation {}: incarnation {} ended uncleanly, so each room's restore runs the repair",
        engine.incarnation(),
        engine
            .unclean_previous()
            .map_or("none".into(), |n| n.to_string())
    );
    assert_eq!(engine.unclean_previous(), Some(child.incarnation));
    // Repairs are owed per namespace (SPEC F11): the child held the rooms' namespace under a
    // term of its own and never released it, so that term is owed one repair per room.
    let owed = engine.owed_repairs(room(0).namespace())?;
    println!(
        "   the child never released namespace {}: repairs owed for term {owed:?}",
        room(0).namespace()
    );
    assert_eq!(owed.len(), 1);
    let label = owed[0];

    for (k, &i) in rooms.iter().enumerate() {
        let state = engine.read(&room(i), Clone::clone)?;
        let acked = child.acks.get(k).copied().unwrap_or(0);
        println!(
            "   {}: {} messages ({acked} acknowledged by the child), repair markers {:?}",
            room(i),
            state.messages,
            state.repairs
        );
        // At least, not exactly: a write can be durable and the child killed before it
        // printed the acknowledgement.
        assert!(state.messages >= messages_before[k] + acked);
        assert_eq!(state.repairs, vec![label]);
    }
    let units = engine.stats().units_run;
    let repaired = after.watch.repair_records.load(Ordering::Relaxed);
    println!("   restore units run: {units}, repair records appended: {repaired}");

    // A restored room is not restored again, so it is not repaired again.
    let again = repairs_of(engine, rooms)?;
    println!(
        "   touched again: repair markers {again:?}; restore units run: {}",
        engine.stats().units_run
    );
    assert!(again.iter().all(|r| *r == vec![label]));
    assert_eq!(engine.stats().units_run, units);

    // Every room is owed the repair, not only the ones touched: warm the rest so each gets it
    // now, exactly once. (Had this incarnation closed first, the next would still owe it.)
    engine.warm()?.wait()?;
    // The repair is owed for `chat`, whose writer died; `moderation` was released cleanly.
    let rooms_total = engine
        .entities()?
        .iter()
        .filter(|e| e.namespace().as_str() == "chat")
        .count() as u64;
    let repaired = after.watch.repair_records.load(Ordering::Relaxed);
    println!("   warmed the other rooms: {repaired} repair records for {rooms_total} rooms");
    assert_eq!(repaired, rooms_total);
    Ok(after)
}

/// Reopens after a clean close: nothing is repaired, and the markers are still there once.
fn reopen_cleanly(dir: &Path, rooms: &[usize]) -> Result<Opened> {
    let (clean, _) = open_engine(dir)?;
    let repairs = repairs_of(&clean.engine, rooms)?;
    println!(
        "   closed cleanly, reopened as incarnation {} (unclean previous: {:?}): repair markers {repairs:?}",
        clean.engine.incarnation(),
        clean.engine.unclean_previous()
    );
    assert_eq!(clean.engine.unclean_previous(), None);
    assert!(clean.engine.owed_repairs(room(0).namespace())?.is_empty());
    assert!(repairs.iter().all(|r| r.len() == 1 && *r == repairs[0]));
    assert_eq!(clean.watch.repair_records.load(Ordering::Relaxed), 0);
    Ok(clean)
}

fn repairs_of(engine: &Engine<ChatRooms>, rooms: &[usize]) -> Result<Vec<Vec<u64>>> {
    rooms
        .iter()
        .map(|&i| engine.read(&room(i), |r| r.repairs.clone()))
        .collect()
}

/// Starts the writer child, waits until it has acknowledged a few writes, kills it with
/// SIGKILL, and collects everything it printed before it died.
fn run_child_until_killed(
    dir: &Path,
    relaunch: &dyn Fn() -> std::io::Result<Command>,
) -> Result<ChildReport> {
    let mut child = relaunch()
        .and_then(|mut command| {
            command
                .env(WRITER_ENV, dir)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
        })
        .map_err(|e| io("starting the writer child", e))?;
    let mut lines = BufReader::new(child.stdout.take().expect("stdout is piped")).lines();
    let mut report = ChildReport::default();
    let mut acks = 0;
    while acks < KILL_AFTER_ACKS {
        match next_line(&mut lines) {
            Some(line) => acks += usize::from(report.take(&line)),
            None => {
                let status = child.wait().map_err(|e| io("waiting for the child", e))?;
                panic!("the writer child exited before it was killed: {status}");
            }
        }
    }
    child
        .kill()
        .map_err(|e| io("killing the writer child", e))?;
    child
        .wait()
        .map_err(|e| io("reaping the writer child", e))?;
    while let Some(line) = next_line(&mut lines) {
        report.take(&line);
    }
    Ok(report)
}

fn next_line(lines: &mut Lines<BufReader<ChildStdout>>) -> Option<String> {
    lines.next().and_then(std::result::Result::ok)
}

// ---------------------------------------------------------------------------------------------
// 7. Close.

fn close_cleanly(opened: Opened) -> Result<()> {
    println!("\n7. Close");
    let incarnation = opened.engine.incarnation();
    opened.close()?;
    println!("   incarnation {incarnation} closed cleanly; the next open will repair nothing");
    Ok(())
}

fn io(context: &str, source: std::io::Error) -> Error {
    Error::Io {
        context: context.into(),
        source,
    }
}
