//! Two owners hand a namespace over: `cargo run --example handover`, or on an etcd of yours,
//! each owner with its own client: `cargo run --features etcd --example handover -- --etcd
//! 127.0.0.1:2379` (it writes under a root of its own, `portcullis-handover/<unique>/`).
//!
//! Owner A serves a namespace of accounts from worker threads. Owner B, an engine over the same
//! store, asks who serves the namespace (`Engine::owner_of`, what a router asks) and takes it
//! over in one call (`Engine::take_over`: it bumps the epoch, runs revocation until `Complete`,
//! and adopts the namespace). A is alive, so B must force it. A's next writes are refused
//! (`Fenced`), and A stops serving the namespace at once; B, which cannot tell a deposed owner
//! from a dead one, repairs each account once. B hands the namespace back cleanly (it releases
//! it; no repair follows). In a second round A dies while serving (its process is gone: it never
//! closes, never releases the namespace, and stops renewing its owner lease); once A's lease has
//! expired, B's take-over needs no force and no operator, and repairs every account exactly
//! once (SPEC F11, F12, R3).
//!
//! The two owners run in one process here, sharing one in-memory store, or each with its own
//! client of one etcd (`--etcd`), on one manual clock (so the example can let A's lease expire
//! without waiting); every claim the example prints is checked. `tests/handover.rs` runs it both
//! ways, and `tests/handover_etcd.rs` runs the owners as two OS processes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};

use parking_lot::Mutex;
use portcullis::engine::{DEFAULT_OWNER_LEASE, Engine, TakeOver};
use portcullis::restore::ApplyContext;
use portcullis::store::{
    Batch, Cursor, KeyRange, MemoryStore, Outcome, Partition, ScanPage, Store, StoreLimits,
    StoreStats,
};
use portcullis::{EntityId, Error, ManualClock, Namespace, Rejection, Result, StateMachine};

/// Accounts in the namespace.
pub const ACCOUNTS: usize = 8;
/// Worker threads per owner.
pub const WORKERS: usize = 4;

/// An account: deposits seen, and the repairs it got (by term).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Account {
    /// Deposits folded.
    pub deposits: u64,
    /// The terms it was repaired for, one entry per repair record.
    pub repairs: Vec<u64>,
}

/// The state machine both owners run. A repair (after a holder ended without releasing the
/// namespace) appends one marker record naming the term it repairs.
#[derive(Default)]
pub struct Ledger;

impl StateMachine for Ledger {
    type State = Account;

    fn fresh(&self, _: &EntityId) -> Account {
        Account::default()
    }

    fn apply(&self, s: &mut Account, _: &ApplyContext<'_>, record: &[u8]) -> Result<(), Rejection> {
        match record.strip_prefix(b"repair:") {
            Some(term) => {
                let term = std::str::from_utf8(term)
                    .ok()
                    .and_then(|t| t.parse().ok())
                    .ok_or_else(|| Rejection::new("bad repair record"))?;
                s.repairs.push(term);
            }
            None => s.deposits += 1,
        }
        Ok(())
    }

    fn encode_checkpoint(&self, s: &Account) -> Result<Vec<u8>, Rejection> {
        let mut out = s.deposits.to_le_bytes().to_vec();
        for r in &s.repairs {
            out.extend_from_slice(&r.to_le_bytes());
        }
        Ok(out)
    }

    fn decode_checkpoint(&self, _: &EntityId, b: &[u8]) -> Result<Account, Rejection> {
        if !b.len().is_multiple_of(8) || b.is_empty() {
            return Err(Rejection::new("bad checkpoint"));
        }
        let mut words = b
            .chunks(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")));
        let deposits = words.next().expect("not empty");
        Ok(Account {
            deposits,
            repairs: words.collect(),
        })
    }

    fn repair(&self, _: &EntityId, _: &Account, unclean: u64) -> Result<Vec<Vec<u8>>, Rejection> {
        Ok(vec![format!("repair:{unclean}").into_bytes()])
    }
}

/// Account `i` of the namespace `bank`.
pub fn account(i: usize) -> EntityId {
    EntityId::new("bank", format!("acct-{i}")).expect("a valid id")
}

/// Opens owner `owner` over `store`, adopting namespaces only when told.
pub fn open(store: &Arc<dyn Store>, owner: &str) -> Result<Engine<Ledger>> {
    Engine::builder(Ledger)
        .store(Arc::clone(store))
        .owner(owner)
        // Namespaces move between these engines: serve only what was adopted explicitly.
        .adopt_on_first_use(false)
        .pool_threads(2)
        .open()
}

/// B takes the namespace over from a holder whose owner lease is live (A serving, or A just
/// killed): `take_over` refuses that unless forced, so B forces it (bump, revoke until Complete,
/// adopt). Returns the new grant.
pub fn take_over(b: &Engine<Ledger>, ns: &Namespace) -> Result<u64> {
    let holder = b.owner_of(ns)?.expect("A holds the namespace");
    println!(
        "   B asks who serves {ns}: owner {:?} (incarnation {}) at epoch {}, live: {}",
        holder.owner, holder.incarnation, holder.epoch, holder.live
    );
    assert!(holder.live, "A's lease is live");
    let refused = b.take_over(ns, TakeOver::new());
    assert!(
        matches!(refused, Err(Error::OwnerLive { .. })),
        "{refused:?}"
    );
    println!("   take_over refuses to take it from a live owner unless forced; B forces it");
    let slices = b.fence().stats().slices;
    let grant = b.take_over(ns, TakeOver::new().force(true))?;
    println!(
        "   B bumped {ns} to epoch {grant}, revoked to Complete in {} slice(s) and adopted it",
        b.fence().stats().slices - slices
    );
    Ok(grant)
}

/// A store connection that dies with its process: after `die`, every call fails, so the
/// engine behind it can neither write nor renew its owner lease (SPEC F12).
pub struct Connection {
    store: Arc<dyn Store>,
    dead: AtomicBool,
}

impl Connection {
    /// A connection to `store`.
    pub fn to(store: Arc<dyn Store>) -> Arc<Connection> {
        Arc::new(Connection {
            store,
            dead: AtomicBool::new(false),
        })
    }

    /// The process died: every later call fails.
    pub fn die(&self) {
        self.dead.store(true, Ordering::SeqCst);
    }

    fn alive(&self) -> Result<()> {
        if self.dead.load(Ordering::SeqCst) {
            return Err(Error::Unavailable {
                reason: "the process behind this connection died".into(),
                retry_after_ms: u64::MAX,
            });
        }
        Ok(())
    }
}

impl Store for Connection {
    fn get(&self, p: &Partition, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.alive()?;
        self.store.get(p, key)
    }
    fn get_many(&self, p: &Partition, keys: &[&[u8]]) -> Result<Vec<Option<Vec<u8>>>> {
        self.alive()?;
        self.store.get_many(p, keys)
    }
    fn scan(
        &self,
        p: &Partition,
        range: &KeyRange,
        cursor: Option<&Cursor>,
        limit: usize,
    ) -> Result<ScanPage> {
        self.alive()?;
        self.store.scan(p, range, cursor, limit)
    }
    fn apply(&self, p: &Partition, batch: &Batch) -> Result<Outcome> {
        self.alive()?;
        self.store.apply(p, batch)
    }
    fn list_partitions(&self, prefix: &[u8]) -> Result<Vec<Partition>> {
        self.alive()?;
        self.store.list_partitions(prefix)
    }
    fn now_ms(&self) -> u64 {
        self.store.now_ms()
    }
    fn limits(&self) -> StoreLimits {
        self.store.limits()
    }
    fn evaluates_deadlines(&self) -> bool {
        self.store.evaluates_deadlines()
    }
    fn exclusive_handle(&self) -> Option<u64> {
        self.store.exclusive_handle()
    }
    fn stats(&self) -> StoreStats {
        self.store.stats()
    }
    fn close(&self) -> Result<()> {
        self.die();
        Ok(())
    }
}

/// A's workers: deposit round-robin until told to stop or refused. Returns the deposits each
/// account was acknowledged, and the first refusal each worker met.
fn serve(
    a: &Engine<Ledger>,
    started: &Barrier,
    stop: &AtomicBool,
) -> (HashMap<usize, u64>, Vec<Option<Error>>) {
    let acked = Mutex::new(HashMap::new());
    let refusals = std::thread::scope(|s| {
        let workers: Vec<_> = (0..WORKERS)
            .map(|w| {
                let (a, acked) = (a.clone(), &acked);
                s.spawn(move || {
                    let mut first = true;
                    for n in 0..1_000_000usize {
                        if stop.load(Ordering::SeqCst) {
                            return None;
                        }
                        let i = (w + n * WORKERS) % ACCOUNTS;
                        match a.append(&account(i), vec![b"deposit".to_vec()]) {
                            Ok(_) => *acked.lock().entry(i).or_insert(0) += 1,
                            Err(e) => {
                                if first {
                                    started.wait();
                                }
                                return Some(e);
                            }
                        }
                        if first {
                            first = false;
                            started.wait();
                        }
                    }
                    None
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("a worker panicked"))
            .collect()
    });
    (acked.into_inner(), refusals)
}

/// Runs both rounds on a fresh in-memory store, checking every claim.
pub fn run() -> Result<()> {
    let clock = ManualClock::new(1_000_000);
    let store: Arc<dyn Store> = Arc::new(MemoryStore::with_clock(Arc::new(clock.clone())));
    run_with(|| Ok(Arc::clone(&store)), &clock)
}

/// Runs both rounds with each owner on a store `connect` gives it (one shared store, or a
/// client each of one etcd), all on `clock`, checking every claim.
pub fn run_with(connect: impl Fn() -> Result<Arc<dyn Store>>, clock: &ManualClock) -> Result<()> {
    let ns = Namespace::new("bank")?;
    let a_connection = Connection::to(connect()?);
    let a = open(&(Arc::clone(&a_connection) as Arc<dyn Store>), "owner-a")?;
    let b = open(&connect()?, "owner-b")?;
    println!("1. Owner A serves {ns}; owner B shares the store");
    let grant = a.own(&ns)?;
    for i in 0..ACCOUNTS {
        a.register(&account(i))?;
    }
    assert!(matches!(b.own(&ns), Err(Error::NotServed { .. })));
    println!("   A adopted {ns} at epoch {grant}; B may not adopt it while A holds it");

    // Round 1: B takes over while A's workers are writing.
    println!("\n2. B takes {ns} over while {WORKERS} workers of A are writing");
    let started = Barrier::new(WORKERS + 1);
    let stop = AtomicBool::new(false);
    let (acked, refusals) = std::thread::scope(|s| {
        let worker_pool = s.spawn(|| serve(&a, &started, &stop));
        started.wait(); // every worker has made a durable write
        let granted = take_over(&b, &ns);
        // A's workers learn it at their next write; the flag only ends a worker that somehow
        // was never refused, which the check below would report.
        let result = worker_pool.join().expect("the workers panicked");
        stop.store(true, Ordering::SeqCst);
        granted.map(|g| (g, result))
    })
    .map(|(g, r)| {
        println!("   B adopted {ns} at epoch {g}");
        r
    })?;
    let fenced = refusals
        .iter()
        .filter(|r| matches!(r, Some(Error::Fenced { .. })))
        .count();
    println!("   {fenced} of A's {WORKERS} workers were refused with Fenced at their next write:");
    if let Some(Some(e)) = refusals.first() {
        println!("     {e}");
    }
    assert_eq!(fenced, WORKERS, "every worker of A is refused");
    assert_eq!(a.grant(&ns), None);
    let again = a.read(&account(0), |s| s.deposits);
    assert!(matches!(again, Err(Error::Fenced { .. })));
    println!("   A stopped serving {ns}: every later call answers Fenced without a store call");

    // No acknowledged write lost, none after Complete: B's view holds exactly A's acks.
    let mut repaired = 0;
    for i in 0..ACCOUNTS {
        let state = b.read(&account(i), Clone::clone)?;
        assert_eq!(
            state.deposits,
            acked.get(&i).copied().unwrap_or(0),
            "account {i}: B holds exactly the deposits A was acknowledged"
        );
        repaired += state.repairs.len();
    }
    let total: u64 = acked.values().sum();
    println!("   B reads all {total} deposits A was acknowledged, and nothing else");
    // A was deposed without releasing the namespace: B cannot tell it from a dead owner, so
    // each account got the repair once.
    assert_eq!(repaired, ACCOUNTS);
    println!("   A never released {ns}, so B repaired each of the {ACCOUNTS} accounts once");
    assert_eq!(b.stats().phases.contained, 0);

    // A clean hand-back: B releases, A adopts again, nothing is repaired.
    println!("\n3. B hands {ns} back cleanly");
    b.release_namespace(&ns)?;
    let grant = a.own(&ns)?;
    assert!(a.owed_repairs(&ns)?.is_empty());
    for i in 0..ACCOUNTS {
        assert_eq!(a.read(&account(i), |s| s.repairs.len())?, 1);
    }
    println!("   B released it; A adopted it again at epoch {grant}; no repair ran");

    // Round 2: A dies while serving.
    println!("\n4. A dies while serving; B takes over");
    let started = Barrier::new(WORKERS + 1);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let worker_pool = s.spawn(|| serve(&a, &started, &stop));
        started.wait();
        stop.store(true, Ordering::SeqCst);
        worker_pool.join().expect("the workers panicked")
    });
    // A crash: the workers stop at an arbitrary point and A's process is gone (its connection
    // dies with it; dropping the last handle would close A cleanly, so the model forgets it),
    // which leaves the store exactly as a process killed mid-flight would: live leases, the
    // namespace not released, the incarnation not ended cleanly, the owner lease not renewed.
    a_connection.die();
    std::mem::forget(a);
    let holder = b.owner_of(&ns)?.expect("A still holds the namespace");
    assert!(
        holder.live
            && matches!(
                b.take_over(&ns, TakeOver::new()),
                Err(Error::OwnerLive { .. })
            )
    );
    println!("   A's owner lease is still live: take_over refuses, and B waits for it to expire");
    clock.advance(DEFAULT_OWNER_LEASE.as_millis() as u64);
    let holder = b.owner_of(&ns)?.expect("A still holds the namespace");
    assert!(!holder.live);
    println!(
        "   A did not renew it: B finds A (incarnation {}) not live, and takes {ns} over \
         without force or operator",
        holder.incarnation
    );
    b.take_over(&ns, TakeOver::new())?;
    let owed = b.owed_repairs(&ns)?;
    assert_eq!(
        owed.len(),
        1,
        "the dead A's term (round 1's was cleared by B's release)"
    );
    let dead_term = owed[0];
    let mut repaired_now = 0;
    for i in 0..ACCOUNTS {
        let repairs = b.read(&account(i), |s| s.repairs.clone())?;
        assert_eq!(repairs.iter().filter(|t| **t == dead_term).count(), 1);
        repaired_now += 1;
    }
    let units = b.stats().units_run;
    for i in 0..ACCOUNTS {
        b.read(&account(i), |_| ())?;
    }
    assert_eq!(b.stats().units_run, units, "touched again: restored once");
    println!(
        "   B repaired each of the {repaired_now} accounts exactly once for A's term {dead_term}"
    );

    // B closes cleanly; a later owner finds nothing owed.
    b.close()?;
    let c = open(&connect()?, "owner-c")?;
    c.own(&ns)?;
    assert!(c.owed_repairs(&ns)?.is_empty());
    for i in 0..ACCOUNTS {
        let repairs = c.read(&account(i), |s| s.repairs.len())?;
        assert_eq!(
            repairs, 2,
            "one repair per take-over from an unreleased holder"
        );
    }
    println!("\n5. B closed cleanly (releasing {ns}); owner C adopts it and repairs nothing");
    c.close()?;
    Ok(())
}

/// Runs the example on the etcd at `endpoint`, under a root no earlier run used.
#[cfg(feature = "etcd")]
pub fn run_on_etcd(endpoint: &str) -> Result<()> {
    let unique = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let root = format!("portcullis-handover/{}-{unique}/", std::process::id());
    println!("(on etcd at {endpoint}, root {root})");
    let clock = ManualClock::new(1_000_000);
    run_with(
        || {
            let store = portcullis::store::EtcdStore::builder(endpoint)
                .prefix(root.clone())
                .clock(Arc::new(clock.clone()))
                .open()?;
            Ok(Arc::new(store) as Arc<dyn Store>)
        },
        &clock,
    )
}

#[allow(dead_code)]
fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [] => run(),
        [flag, endpoint] if flag == "--etcd" => on_etcd(endpoint),
        _ => Err(Error::InvalidArgument(
            "usage: handover [--etcd HOST:PORT] (the etcd option needs --features etcd)".into(),
        )),
    }
}

#[cfg(feature = "etcd")]
fn on_etcd(endpoint: &str) -> Result<()> {
    run_on_etcd(endpoint)
}

#[cfg(not(feature = "etcd"))]
fn on_etcd(_endpoint: &str) -> Result<()> {
    Err(Error::InvalidArgument(
        "this build has no etcd backend: run it with --features etcd".into(),
    ))
}
