//! A throwaway single-node etcd for tests (feature `etcd`), and a TCP proxy that loses answers
//! on purpose.
//!
//! [`EtcdServer::start`] runs the `etcd` binary (Debian's `etcd-server`; `.ci/run` installs it)
//! on free loopback ports with its data in a temporary directory, waits until `/health` answers
//! `true`, and stops the process by its id when dropped. [`FaultProxy`] sits between a store
//! and etcd and, per request, forwards it, forwards it and drops the answer, or swallows it.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// A single-node etcd on loopback ports, data in a temporary directory; stopped on drop.
pub struct EtcdServer {
    child: Option<Child>,
    client_port: u16,
    peer_port: u16,
    dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind a loopback port")
        .port()
}

impl EtcdServer {
    /// Starts etcd and waits until it is healthy. Panics with the reason (and etcd's log) if it
    /// cannot: the `etcd` binary missing, or no healthy server within 30 s after three tries.
    pub fn start() -> EtcdServer {
        let dir = tempfile::tempdir().expect("temporary directory");
        let mut server = EtcdServer {
            child: None,
            client_port: 0,
            peer_port: 0,
            dir,
        };
        for _ in 0..3 {
            // Two free ports; another process may take one before etcd binds it, so a server
            // that exits at once is retried on fresh ports.
            server.client_port = free_port();
            server.peer_port = free_port();
            if server.client_port != server.peer_port && server.launch() {
                return server;
            }
        }
        panic!("etcd did not start; its log:\n{}", server.log());
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("etcd.log")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Runs the process and waits for health; false if it exited.
    fn launch(&mut self) -> bool {
        let client = format!("http://127.0.0.1:{}", self.client_port);
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("etcd log file");
        let child = Command::new("etcd")
            .arg("--name=test")
            .arg(format!(
                "--data-dir={}",
                self.dir.path().join("data").display()
            ))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=test={peer}"))
            .arg("--logger=zap")
            .arg("--log-level=warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log handle"))
            .stderr(log)
            .spawn();
        let child = match child {
            Ok(child) => child,
            Err(e) => panic!(
                "cannot run `etcd` ({e}): install it (Debian: apt-get install -y etcd-server)"
            ),
        };
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                log_line(&format!("etcd exited at start ({status})"));
                self.child = None;
                return false;
            }
            if self.healthy() {
                return true;
            }
            // Waiting for another process to come up: there is nothing to synchronise on but
            // its answers, polled with a bounded number of short pauses.
            thread::sleep(Duration::from_millis(25));
        }
        self.stop();
        false
    }

    fn healthy(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.client_port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let request = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
        if s.write_all(request.as_bytes()).is_err() {
            return false;
        }
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        answer.contains("\"health\":\"true\"")
    }

    /// `127.0.0.1:port` of the client listener.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// The process id of the running server.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Stops the server (SIGKILL, by its process id) and waits for it to exit. Its data stays.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same ports and data, and waits until it is healthy.
    pub fn restart(&mut self) {
        self.stop();
        assert!(
            self.launch(),
            "etcd did not restart; its log:\n{}",
            self.log()
        );
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn log_line(msg: &str) {
    eprintln!("[etcd test server] {msg}");
}

/// What [`FaultProxy`] does with one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Forwards the request and its answer.
    Forward,
    /// Forwards the request, waits for etcd's whole answer (so etcd has acted on it), then
    /// closes the client's connection without passing the answer on.
    DropAnswer,
    /// Reads the request and closes the connection; etcd never sees it.
    Swallow,
    /// Reads the request, closes the connection, and keeps the request until
    /// [`FaultProxy::release_held`] delivers it: a copy delayed in the network.
    Hold,
}

struct ProxyState {
    plan: Mutex<VecDeque<Fault>>,
    default: Mutex<Fault>,
    stop: AtomicBool,
    requests: AtomicUsize,
    dropped: AtomicUsize,
    held: Mutex<Vec<Vec<u8>>>,
    upstream: String,
}

/// A loopback TCP proxy in front of etcd that applies a planned [`Fault`] to each HTTP request
/// (then the default one, [`Fault::Forward`] unless changed). Stops on drop.
pub struct FaultProxy {
    port: u16,
    state: Arc<ProxyState>,
    accept: Option<thread::JoinHandle<()>>,
}

impl FaultProxy {
    /// A proxy to etcd at `upstream` (`host:port`).
    pub fn start(upstream: &str) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(ProxyState {
            plan: Mutex::new(VecDeque::new()),
            default: Mutex::new(Fault::Forward),
            stop: AtomicBool::new(false),
            requests: AtomicUsize::new(0),
            dropped: AtomicUsize::new(0),
            held: Mutex::new(Vec::new()),
            upstream: upstream.to_string(),
        });
        let upstream = upstream.to_string();
        let st = state.clone();
        let accept = thread::spawn(move || {
            for conn in listener.incoming() {
                if st.stop.load(Ordering::Acquire) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let st = st.clone();
                let upstream = upstream.clone();
                thread::spawn(move || serve(conn, &upstream, &st));
            }
        });
        FaultProxy {
            port,
            state,
            accept: Some(accept),
        }
    }

    /// `127.0.0.1:port` of the proxy.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The next requests get these faults, in order.
    pub fn plan(&self, faults: &[Fault]) {
        self.state.plan.lock().extend(faults.iter().copied());
    }

    /// Requests after the planned ones get `fault`.
    pub fn set_default(&self, fault: Fault) {
        *self.state.default.lock() = fault;
    }

    /// Delivers every held request to etcd now, each on its own connection, and returns
    /// etcd's answers.
    pub fn release_held(&self) -> Vec<String> {
        let held = std::mem::take(&mut *self.state.held.lock());
        held.into_iter()
            .map(|request| {
                let s = TcpStream::connect(&self.state.upstream).expect("connect to etcd");
                let mut w = s.try_clone().unwrap();
                w.write_all(&request).expect("deliver a held request");
                let answer = read_message(&mut BufReader::new(s)).expect("etcd's answer");
                String::from_utf8_lossy(&answer).into_owned()
            })
            .collect()
    }

    /// Requests seen so far.
    pub fn requests(&self) -> usize {
        self.state.requests.load(Ordering::Acquire)
    }

    /// Requests whose answer was dropped or that were swallowed.
    pub fn faults_applied(&self) -> usize {
        self.state.dropped.load(Ordering::Acquire)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Release);
        // Wake the accept loop.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

/// Reads one HTTP message (headers, then a Content-Length or chunked body). `None` at EOF.
fn read_message(r: &mut BufReader<TcpStream>) -> Option<Vec<u8>> {
    let mut msg = Vec::new();
    let mut length = 0usize;
    let mut chunked = false;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let lower = line.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            length = v.trim().parse().ok()?;
        }
        if lower.starts_with("transfer-encoding:") && lower.contains("chunked") {
            chunked = true;
        }
        msg.extend_from_slice(line.as_bytes());
        if line == "\r\n" {
            break;
        }
    }
    if chunked {
        loop {
            let mut size = String::new();
            if r.read_line(&mut size).ok()? == 0 {
                return None;
            }
            msg.extend_from_slice(size.as_bytes());
            let n = usize::from_str_radix(size.trim(), 16).ok()?;
            let mut chunk = vec![0; n + 2];
            r.read_exact(&mut chunk).ok()?;
            msg.extend_from_slice(&chunk);
            if n == 0 {
                return Some(msg);
            }
        }
    }
    let start = msg.len();
    msg.resize(start + length, 0);
    r.read_exact(&mut msg[start..]).ok()?;
    Some(msg)
}

fn serve(client: TcpStream, upstream: &str, st: &ProxyState) {
    let Ok(mut client_w) = client.try_clone() else {
        return;
    };
    let mut client_r = BufReader::new(client);
    let mut up: Option<(TcpStream, BufReader<TcpStream>)> = None;
    while let Some(request) = read_message(&mut client_r) {
        if st.stop.load(Ordering::Acquire) {
            break;
        }
        st.requests.fetch_add(1, Ordering::AcqRel);
        let fault = st.plan.lock().pop_front().unwrap_or(*st.default.lock());
        if fault == Fault::Swallow || fault == Fault::Hold {
            if fault == Fault::Hold {
                st.held.lock().push(request);
            }
            st.dropped.fetch_add(1, Ordering::AcqRel);
            break;
        }
        if up.is_none() {
            let Ok(s) = TcpStream::connect(upstream) else {
                break;
            };
            let r = BufReader::new(s.try_clone().unwrap());
            up = Some((s, r));
        }
        let (up_w, up_r) = up.as_mut().unwrap();
        if up_w.write_all(&request).is_err() {
            break;
        }
        let Some(answer) = read_message(up_r) else {
            break;
        };
        if fault == Fault::DropAnswer {
            st.dropped.fetch_add(1, Ordering::AcqRel);
            break;
        }
        if client_w.write_all(&answer).is_err() {
            break;
        }
    }
    let _ = client_w.shutdown(Shutdown::Both);
}

/// Plain requests to etcd's JSON gateway, beside the store: to look at what the store wrote
/// and to measure raw transactions.
pub struct RawEtcd {
    agent: ureq::Agent,
    base: String,
}

impl RawEtcd {
    /// A client of etcd at `endpoint` (`host:port`).
    pub fn new(endpoint: &str) -> RawEtcd {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_idle_connections(64)
            .max_idle_connections_per_host(64)
            .no_delay(true)
            .build()
            .new_agent();
        RawEtcd {
            agent,
            base: format!("http://{endpoint}"),
        }
    }

    /// POSTs a JSON body and returns the JSON answer; panics on a transport error or an error
    /// answer.
    pub fn post(&self, path: &str, body: &serde_json::Value) -> serde_json::Value {
        let mut answer = self
            .agent
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .send(serde_json::to_vec(body).unwrap().as_slice())
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        let status = answer.status().as_u16();
        let json: serde_json::Value = answer.body_mut().read_json().expect("a JSON answer");
        assert_eq!(status, 200, "{path}: {json}");
        json
    }

    /// The value and version (how many times it was put since created) of `key`, if present.
    pub fn get(&self, key: &[u8]) -> Option<(Vec<u8>, u64)> {
        let answer = self.post("/v3/kv/range", &serde_json::json!({"key": b64(key)}));
        let kv = answer["kvs"].get(0)?;
        let value = kv["value"].as_str().map(unb64).unwrap_or_default();
        let version = kv["version"].as_str().unwrap_or("0").parse().unwrap();
        Some((value, version))
    }

    /// Puts `value` at every key that starts with `prefix`; returns how many.
    pub fn overwrite_prefix(&self, prefix: &[u8], value: &[u8]) -> usize {
        let mut end = prefix.to_vec();
        *end.last_mut().unwrap() += 1;
        let answer = self.post(
            "/v3/kv/range",
            &serde_json::json!({"key": b64(prefix), "range_end": b64(&end), "keys_only": true}),
        );
        let keys: Vec<Vec<u8>> = answer["kvs"]
            .as_array()
            .map(|kvs| {
                kvs.iter()
                    .map(|kv| unb64(kv["key"].as_str().unwrap()))
                    .collect()
            })
            .unwrap_or_default();
        for k in &keys {
            self.put_txn(k, value);
        }
        keys.len()
    }

    /// Revokes every lease etcd holds (deleting the keys attached to them).
    pub fn revoke_all_leases(&self) -> usize {
        let leases = self.post("/v3/lease/leases", &serde_json::json!({}));
        let ids: Vec<String> = leases["leases"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|l| l["ID"].as_str().unwrap().to_string())
                    .collect()
            })
            .unwrap_or_default();
        for id in &ids {
            self.post("/v3/lease/revoke", &serde_json::json!({"ID": id}));
        }
        ids.len()
    }

    /// One transaction that puts `value` at `key`: a raw durable single-row commit.
    pub fn put_txn(&self, key: &[u8], value: &[u8]) {
        let body = serde_json::json!({"success": [
            {"request_put": {"key": b64(key), "value": b64(value)}}
        ]});
        let answer = self.post("/v3/kv/txn", &body);
        assert_eq!(answer["succeeded"], serde_json::Value::Bool(true));
    }
}

impl RawEtcd {
    /// One transaction that puts `value` at `key` and `mark` at `marker`: what a raw commit
    /// costs with one more key written (as `EtcdStore` writes its marker slot).
    /// With `expect`, the transaction also compares the marker's value with it (as
    /// `EtcdStore` compares its slot).
    pub fn put_txn_marked(
        &self,
        key: &[u8],
        value: &[u8],
        marker: &[u8],
        mark: &[u8],
        expect: Option<&[u8]>,
    ) {
        let compare: Vec<serde_json::Value> = expect
            .map(|e| serde_json::json!({"key": b64(marker), "target": "VALUE", "result": "EQUAL", "value": b64(e)}))
            .into_iter()
            .collect();
        let body = serde_json::json!({"compare": compare, "success": [
            {"request_put": {"key": b64(key), "value": b64(value)}},
            {"request_put": {"key": b64(marker), "value": b64(mark)}},
        ]});
        let answer = self.post("/v3/kv/txn", &body);
        assert_eq!(answer["succeeded"], serde_json::Value::Bool(true));
    }
}

/// Where `EtcdStore` under `root` keeps row `key` of partition `partition` (docs/etcd.md).
pub fn row_key(root: &[u8], partition: &[u8], key: &[u8]) -> Vec<u8> {
    let mut k = root.to_vec();
    k.push(b'd');
    k.push(u8::try_from(partition.len()).unwrap());
    k.extend_from_slice(partition);
    k.extend_from_slice(key);
    k
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding.
pub fn b64(bytes: &[u8]) -> String {
    let mut out = String::new();
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            out.push(if i <= c.len() {
                char::from(B64[(n >> (18 - 6 * i)) as usize & 63])
            } else {
                '='
            });
        }
    }
    out
}

/// Decodes standard base64.
pub fn unb64(text: &str) -> Vec<u8> {
    let digits: Vec<u32> = text
        .bytes()
        .filter(|&c| c != b'=')
        .map(|c| B64.iter().position(|&d| d == c).expect("base64 digit") as u32)
        .collect();
    let mut out = Vec::new();
    for c in digits.chunks(4) {
        let n = c
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, d)| n | (d << (18 - 6 * i)));
        out.extend_from_slice(&n.to_be_bytes()[1..c.len()]);
    }
    out
}
