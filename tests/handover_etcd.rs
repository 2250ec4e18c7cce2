//! Two owners in two OS processes on one throwaway etcd (SPEC F11, F7, S11). Owner A runs in a
//! child process (this test binary, re-executed to run `owner_a_child`), owner B in the test's
//! own process, each with its own `EtcdStore` client. Feature `etcd`; needs the `etcd` binary.
//!
//! 1. A serves `bank` and writes; B bumps and revokes to `Complete` and adopts it. A's next
//!    write is refused with `Fenced` and A stops serving; B holds exactly the deposits A was
//!    acknowledged, and repairs each account once (A never released the namespace).
//! 2. B hands the namespace back; A adopts it and writes; A is killed with SIGKILL mid-write;
//!    B's take-over repairs each account exactly once for A's term, and loses no deposit A was
//!    acknowledged.
//! 3. B writes from several threads while etcd is stopped and started again on the same data
//!    directory: no acknowledged deposit is lost.
//!
//! And two processes that both leave the owner id at its default never collide (SPEC F12): the
//! second is refused at open with `OwnerLive` naming the first one's incarnation (before, it
//! took that open incarnation for a crash and took its namespaces at the same epoch), also
//! right after the first was killed (its lease is still live), and opens once the first closed.
//!
//! The processes synchronise through pipes (A reports each step on its stdout, B sends commands
//! on A's stdin), never by sleeping.
#![cfg(feature = "etcd")]

mod common;
#[path = "../examples/handover.rs"]
#[allow(dead_code)]
mod handover;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::etcd::EtcdServer;
use crossbeam::channel;
use handover::{ACCOUNTS, Ledger, account, open, take_over};
use portcullis::engine::Engine;
use portcullis::store::{EtcdStore, Store};
use portcullis::{Error, Namespace};

/// Set in the child's environment: `<etcd endpoint> <root>`.
const CHILD_ENV: &str = "PORTCULLIS_HANDOVER_CHILD";
const ROOT: &str = "handover/";

fn connect(endpoint: &str, root: &str) -> Arc<dyn Store> {
    let store = EtcdStore::builder(endpoint)
        .prefix(root)
        .open()
        .expect("open the etcd store");
    Arc::new(store)
}

fn ns() -> Namespace {
    Namespace::new("bank").unwrap()
}

fn deposit() -> Vec<Vec<u8>> {
    vec![b"deposit".to_vec()]
}

/// Owner A, in the child process. Reports on stdout, one line per step, each starting `A: `:
/// `serving <grant>`, `ack <account>` per acknowledged deposit, `refused <code>` at the first
/// refusal, then `stopped <n>` after `n` more calls were all answered `Fenced`. On `own` (stdin)
/// it adopts the namespace again and writes until it is killed.
#[test]
#[ignore = "owner A of two_processes_hand_a_namespace_over_through_one_etcd, run as its child"]
fn owner_a_child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (endpoint, root) = spec.split_once(' ').expect("endpoint and root");
    let a = open(&connect(endpoint, root), "owner-a").unwrap();
    let ns = ns();
    let mut commands = std::io::stdin().lock().lines();
    loop {
        println!("A: serving {}", a.own(&ns).unwrap());
        for i in 0..ACCOUNTS {
            a.register(&account(i)).unwrap();
        }
        // Writes until refused; killed by the parent in round 2, so bounded only by count.
        let mut refusal = None;
        for n in 0..1_000_000 {
            let i = n % ACCOUNTS;
            match a.append(&account(i), deposit()) {
                Ok(_) => println!("A: ack {i}"),
                Err(e) => {
                    refusal = Some(e);
                    break;
                }
            }
        }
        let refusal = refusal.expect("A was never refused");
        println!("A: refused {}", refusal.code());
        let fenced = (0..ACCOUNTS)
            .filter(|&i| matches!(a.append(&account(i), deposit()), Err(Error::Fenced { .. })))
            .count();
        assert_eq!(a.grant(&ns), None, "A stopped serving the namespace");
        println!("A: stopped {fenced}");
        match commands.next() {
            Some(Ok(line)) if line == "own" => continue,
            _ => return,
        }
    }
}

/// Owner A's process, killed (SIGKILL, by its id) when dropped.
struct OwnerA {
    child: Child,
    stdin: ChildStdin,
    /// A's reports (the text after `A: `), read from its stdout by a thread of their own.
    reports: channel::Receiver<String>,
    /// Deposits A was acknowledged, per account.
    acked: [u64; ACCOUNTS],
}

/// Forwards every report of A (a line with `A: `, which may follow the test harness's own
/// text on the same line) until A's stdout closes.
fn forward_reports(stdout: ChildStdout, reports: channel::Sender<String>) {
    forward_reports_of("A: ", stdout, reports);
}

/// Forwards every report (the text after `prefix`) until the child's stdout closes.
fn forward_reports_of(prefix: &str, stdout: ChildStdout, reports: channel::Sender<String>) {
    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
        if let Some((_, report)) = line.split_once(prefix)
            && reports.send(report.to_string()).is_err()
        {
            return;
        }
    }
}

/// How long the test waits for A's next report before it fails (a bound on a hang, never a
/// pause: reports arrive as soon as A writes them).
const REPORT_BOUND: Duration = Duration::from_secs(120);

impl OwnerA {
    fn spawn(endpoint: &str) -> OwnerA {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["owner_a_child", "--exact", "--ignored", "--nocapture"])
            .args(["--test-threads", "1"])
            .env(CHILD_ENV, format!("{endpoint} {ROOT}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("run owner A");
        let stdin = child.stdin.take().unwrap();
        let (tx, reports) = channel::unbounded();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || forward_reports(stdout, tx));
        OwnerA {
            child,
            stdin,
            reports,
            acked: [0; ACCOUNTS],
        }
    }

    fn count(&mut self, report: &str) {
        if let Some(i) = report.strip_prefix("ack ") {
            self.acked[i.parse::<usize>().unwrap()] += 1;
        }
    }

    /// Reads A's reports up to the first that `stop` accepts (acks are counted on the way);
    /// answers it. Panics if A ends first or reports nothing for [`REPORT_BOUND`].
    fn until(&mut self, mut stop: impl FnMut(&str, &[u64; ACCOUNTS]) -> bool) -> String {
        loop {
            let report = match self.reports.recv_timeout(REPORT_BOUND) {
                Ok(report) => report,
                Err(e) => panic!(
                    "owner A reported nothing more ({e}): {:?}",
                    self.child.try_wait()
                ),
            };
            self.count(&report);
            if stop(&report, &self.acked) {
                return report;
            }
        }
    }

    fn send(&mut self, command: &str) {
        writeln!(self.stdin, "{command}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// SIGKILL, then reads what A reported before it died (its stdout closes with it).
    fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        while let Ok(report) = self.reports.recv_timeout(REPORT_BOUND) {
            self.count(&report);
        }
    }
}

impl Drop for OwnerA {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn two_processes_hand_a_namespace_over_through_one_etcd() {
    let mut server = EtcdServer::start();
    let endpoint = server.endpoint();
    let ns = ns();

    // 1. A serves and writes; B takes over.
    let mut a = OwnerA::spawn(&endpoint);
    a.until(|r, _| r.starts_with("serving"));
    a.until(|_, acked| acked.iter().sum::<u64>() >= 3 * ACCOUNTS as u64);
    let b = open(&connect(&endpoint, ROOT), "owner-b").unwrap();
    take_over(&b, &ns).unwrap();
    let refused = a.until(|r, _| r.starts_with("refused"));
    let fenced = Error::Fenced {
        grant: 0,
        current: 1,
    };
    assert_eq!(
        refused,
        format!("refused {}", fenced.code()),
        "A's first refusal is Fenced"
    );
    let stopped = a.until(|r, _| r.starts_with("stopped"));
    assert_eq!(
        stopped,
        format!("stopped {ACCOUNTS}"),
        "every later write is Fenced"
    );
    let mut deposits = [0u64; ACCOUNTS];
    for (i, d) in deposits.iter_mut().enumerate() {
        let state = b.read(&account(i), Clone::clone).unwrap();
        assert_eq!(
            state.deposits, a.acked[i],
            "account {i}: B holds exactly the deposits A was acknowledged"
        );
        assert_eq!(state.repairs.len(), 1, "A never released: one repair");
        *d = state.deposits;
    }

    // 2. B hands back; A adopts and writes; A is killed mid-write; B takes over again.
    b.release_namespace(&ns).unwrap();
    a.acked = [0; ACCOUNTS];
    a.send("own");
    a.until(|r, _| r.starts_with("serving"));
    a.until(|_, acked| acked.iter().sum::<u64>() >= 2 * ACCOUNTS as u64);
    a.kill();
    // Counted before the take-over: the background warm it starts may restore accounts first.
    let units = b.stats().units_run;
    take_over(&b, &ns).unwrap();
    let owed = b.owed_repairs(&ns).unwrap();
    assert_eq!(owed.len(), 1, "the killed A's term: {owed:?}");
    for (i, d) in deposits.iter_mut().enumerate() {
        let state = b.read(&account(i), Clone::clone).unwrap();
        let repaired = state.repairs.iter().filter(|t| **t == owed[0]).count();
        assert_eq!(
            repaired, 1,
            "account {i}: repaired exactly once for A's term"
        );
        // At most one write was in flight when A died (A writes from one thread).
        let expected = *d + a.acked[i];
        assert!(
            state.deposits == expected || state.deposits == expected + 1,
            "account {i}: {} deposits, {expected} acknowledged",
            state.deposits
        );
        *d = state.deposits;
    }
    for i in 0..ACCOUNTS {
        b.read(&account(i), |_| ()).unwrap();
    }
    assert_eq!(
        b.stats().units_run,
        units + ACCOUNTS as u64,
        "restored once each"
    );
    drop(a);

    // 3. etcd stops and starts again on the same data while B writes from two threads.
    let stop = AtomicBool::new(false);
    let (events, seen) = channel::unbounded::<Option<usize>>();
    let acked_after = std::thread::scope(|s| {
        let workers: Vec<_> = (0..2)
            .map(|w| {
                let (b, stop, events) = (&b, &stop, events.clone());
                s.spawn(move || {
                    let mut acked = [0u64; ACCOUNTS];
                    let mut n = w;
                    while !stop.load(Ordering::SeqCst) {
                        let i = n % ACCOUNTS;
                        n += 2;
                        match b.append(&account(i), deposit()) {
                            Ok(_) => {
                                acked[i] += 1;
                                events.send(Some(i)).unwrap();
                            }
                            Err(_) => events.send(None).unwrap(),
                        }
                    }
                    acked
                })
            })
            .collect();
        let next = |want_ack: bool| loop {
            let event = seen
                .recv_timeout(Duration::from_secs(60))
                .expect("B's writers made no progress");
            if event.is_some() == want_ack {
                return;
            }
        };
        for _ in 0..ACCOUNTS {
            next(true);
        }
        server.stop();
        next(false); // a write failed while etcd was down
        server.restart();
        for _ in 0..ACCOUNTS {
            next(true);
        }
        stop.store(true, Ordering::SeqCst);
        let mut total = [0u64; ACCOUNTS];
        for w in workers {
            for (t, n) in total.iter_mut().zip(w.join().unwrap()) {
                *t += n;
            }
        }
        total
    });
    // A fresh owner reads what etcd kept: every acknowledged deposit.
    b.close().unwrap();
    let c = open(&connect(&endpoint, ROOT), "owner-c").unwrap();
    c.own(&ns).unwrap();
    for i in 0..ACCOUNTS {
        let kept = c.read(&account(i), |s| s.deposits).unwrap();
        assert!(
            kept >= deposits[i] + acked_after[i],
            "account {i}: {kept} deposits kept, {} acknowledged",
            deposits[i] + acked_after[i]
        );
    }
    c.close().unwrap();
}

/// Set in the default-owner child's environment: `<etcd endpoint> <root>`.
const DEFAULT_CHILD_ENV: &str = "PORTCULLIS_DEFAULT_OWNER_CHILD";
const DEFAULT_ROOT: &str = "default-owners/";

/// An engine that leaves the owner id at its default, in a child process. Reports `D: open
/// <incarnation>`, serves a deposit, then on `close` (stdin) closes cleanly and reports
/// `D: closed`; it is killed otherwise.
#[test]
#[ignore = "the first process of two_processes_with_the_default_owner_id_never_collide"]
fn default_owner_child() {
    let Ok(spec) = std::env::var(DEFAULT_CHILD_ENV) else {
        return;
    };
    let (endpoint, root) = spec.split_once(' ').expect("endpoint and root");
    let engine = Engine::builder(Ledger)
        .store(connect(endpoint, root))
        .pool_threads(1)
        .open()
        .unwrap();
    engine.register(&account(0)).unwrap();
    engine.append(&account(0), deposit()).unwrap();
    println!("D: open {}", engine.incarnation());
    for line in std::io::stdin().lock().lines() {
        if line.unwrap() == "close" {
            engine.close().unwrap();
            println!("D: closed");
            return;
        }
    }
}

/// The default-owner child: its reports, and its stdin.
struct DefaultOwner {
    child: Child,
    stdin: ChildStdin,
    reports: channel::Receiver<String>,
}

impl DefaultOwner {
    fn spawn(endpoint: &str) -> DefaultOwner {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["default_owner_child", "--exact", "--ignored", "--nocapture"])
            .args(["--test-threads", "1"])
            .env(DEFAULT_CHILD_ENV, format!("{endpoint} {DEFAULT_ROOT}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("run the first process");
        let stdin = child.stdin.take().unwrap();
        let (tx, reports) = channel::unbounded();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || forward_reports_of("D: ", stdout, tx));
        DefaultOwner {
            child,
            stdin,
            reports,
        }
    }

    fn next(&self) -> String {
        self.reports
            .recv_timeout(REPORT_BOUND)
            .expect("the first process reported nothing more")
    }
}

impl Drop for DefaultOwner {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn two_processes_with_the_default_owner_id_never_collide() {
    let server = EtcdServer::start();
    let endpoint = server.endpoint();
    let open_default = || {
        Engine::builder(Ledger)
            .store(connect(&endpoint, DEFAULT_ROOT))
            .pool_threads(1)
            .open()
    };
    let assert_refused = |incarnation: u64| {
        let err = open_default().expect_err("the owner id is live in the other process");
        assert!(
            matches!(&err, Error::OwnerLive { owner, incarnation: i, .. }
                if owner == "default" && *i == incarnation),
            "{err}"
        );
        assert_eq!(err.code(), 18);
    };
    // The first process serves; the second is refused while it lives.
    let mut first = DefaultOwner::spawn(&endpoint);
    assert_eq!(first.next(), "open 1");
    assert_refused(1);
    writeln!(first.stdin, "close").unwrap();
    first.stdin.flush().unwrap();
    assert_eq!(first.next(), "closed");
    // Once it closed cleanly, the owner id is free at once, and nothing was taken for a crash.
    let second = open_default().unwrap();
    assert_eq!((second.incarnation(), second.unclean_previous()), (2, None));
    assert_eq!(second.read(&account(0), |s| s.repairs.len()).unwrap(), 0);
    second.close().unwrap();
    // Killed, a process's lease stays live until it expires: still never taken for a crash.
    let mut third = DefaultOwner::spawn(&endpoint);
    assert_eq!(third.next(), "open 3");
    third.child.kill().unwrap();
    third.child.wait().unwrap();
    assert_refused(3);
}
