//! The HTTP side of the etcd backend: one blocking `ureq` agent speaking etcd's v3 JSON gateway,
//! the answers it decodes, and how a failed request is classified (SPEC S11).
//!
//! The distinction that matters is whether a failed request may have reached etcd. A refused
//! connection (or a failed name lookup or connect) certainly did not; anything after the
//! connection was made (a timeout, a reset, a half-read answer) may have, and a write that may
//! have reached etcd may have committed.

use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, Deserializer};

use ureq::config::AutoHeaderValue;
use ureq::http::Uri;

use super::keys::unb64;
use crate::error::{Error, Result};

/// Why a request failed.
#[derive(Debug, Clone)]
pub(crate) enum Failure {
    /// The request never left this process: etcd cannot have seen it.
    NotSent(String),
    /// The request may have reached etcd; its answer was lost.
    Ambiguous(String),
    /// etcd answered with an error: it decided, and nothing was applied.
    Refused {
        /// The gRPC status code etcd gave (3 invalid argument, 5 not found, 11 out of range,
        /// 14 unavailable, ...).
        code: i64,
        /// etcd's message.
        message: String,
    },
}

impl Failure {
    /// etcd's own "try again" answers: leader changes, timeouts inside etcd. A write refused
    /// this way may still have been proposed, so it is treated as ambiguous.
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            Failure::NotSent(_) | Failure::Ambiguous(_) => true,
            // 4 deadline exceeded, 10 aborted, 14 unavailable (no leader, leader changed,
            // request timed out).
            Failure::Refused { code, .. } => matches!(code, 4 | 10 | 14),
        }
    }

    pub(crate) fn describe(&self, endpoint: &str) -> String {
        match self {
            Failure::NotSent(why) | Failure::Ambiguous(why) => format!("etcd at {endpoint} {why}"),
            Failure::Refused { code, message } => {
                format!("etcd at {endpoint} answered error {code}: {message}")
            }
        }
    }
}

/// etcd's transaction and range paths, whose URIs a client keeps parsed.
pub(crate) const TXN: &str = "/v3/kv/txn";
pub(crate) const RANGE: &str = "/v3/kv/range";

/// A blocking client of one etcd endpoint.
#[derive(Debug)]
pub(crate) struct Client {
    agent: ureq::Agent,
    base: String,
    endpoint: String,
    txn: Uri,
    range: Uri,
}

impl Client {
    /// A client of `endpoint` (`host:port`, or a URL starting with `http://`).
    pub(crate) fn new(endpoint: &str, timeout: Duration, connections: usize) -> Result<Self> {
        let base = if endpoint.contains("://") {
            endpoint.trim_end_matches('/').to_string()
        } else {
            format!("http://{endpoint}")
        };
        if !base.starts_with("http://") {
            return Err(Error::invalid(format!(
                "etcd endpoint {endpoint}: only http:// is supported (this build has no TLS)"
            )));
        }
        let endpoint = base.trim_start_matches("http://").to_string();
        let parse = |path: &str| {
            format!("{base}{path}").parse::<Uri>().map_err(|e| {
                Error::invalid(format!(
                    "etcd endpoint {endpoint}: not a valid address ({e})"
                ))
            })
        };
        let (txn, range) = (parse(TXN)?, parse(RANGE)?);
        let agent = ureq::Agent::config_builder()
            // Hand 4xx/5xx bodies back: etcd explains its refusals in them.
            .http_status_as_error(false)
            // A bound on each read and each write rather than on a whole request or phase: a
            // deadline makes the socket's timeout different for every read and write, which
            // costs a system call each time (three per commit); a fixed bound is set once per
            // connection. etcd answers a request in one or two reads, so the bound is still
            // how long etcd may leave a request unanswered.
            .timeout_connect(Some(timeout))
            .timeout_per_read(Some(timeout))
            .timeout_per_write(Some(timeout))
            .max_idle_connections(connections)
            .max_idle_connections_per_host(connections)
            .no_delay(true)
            // Headers etcd does not read, which its gateway would parse on every request.
            .user_agent(AutoHeaderValue::None)
            .accept(AutoHeaderValue::None)
            .build()
            .new_agent();
        Ok(Client {
            agent,
            base,
            endpoint,
            txn,
            range,
        })
    }

    /// `host:port`, for messages.
    pub(crate) fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// POSTs `body` to `path` and decodes the answer.
    pub(crate) fn post<T: de::DeserializeOwned>(
        &self,
        path: &str,
        body: &[u8],
    ) -> std::result::Result<T, Failure> {
        let bytes = self.post_bytes(path, body)?;
        serde_json::from_slice(&bytes).map_err(|e| {
            // A garbled answer to a write leaves its fate unknown.
            Failure::Ambiguous(format!(
                "sent an answer to {path} that does not decode: {e}"
            ))
        })
    }

    /// POSTs `body` (JSON) to `path` and returns the body of etcd's `200 OK` answer.
    pub(crate) fn post_bytes(
        &self,
        path: &str,
        body: &[u8],
    ) -> std::result::Result<Vec<u8>, Failure> {
        let mut response = self
            .agent
            .post(self.uri(path))
            .send(body)
            .map_err(classify)?;
        let status = response.status().as_u16();
        let bytes = response
            .body_mut()
            .with_config()
            .limit(1 << 40)
            .read_to_vec()
            .map_err(|e| Failure::Ambiguous(format!("lost the answer to {path}: {e}")))?;
        if status != 200 {
            let refusal: ErrorBody = serde_json::from_slice(&bytes).unwrap_or_else(|_| ErrorBody {
                code: -i64::from(status),
                message: format!(
                    "HTTP {status}: {}",
                    String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
                ),
            });
            return Err(Failure::Refused {
                code: refusal.code,
                message: refusal.message,
            });
        }
        Ok(bytes)
    }

    /// The URI of `path`: parsed once per path, then cloned (a reference count).
    fn uri(&self, path: &str) -> Uri {
        match path {
            TXN => self.txn.clone(),
            RANGE => self.range.clone(),
            _ => format!("{}{path}", self.base)
                .parse()
                .expect("the base parsed at open, and every path is a constant"),
        }
    }
}

/// Sorts a transport error by whether the request may have reached etcd.
fn classify(e: ureq::Error) -> Failure {
    use std::io::ErrorKind;
    match e {
        ureq::Error::Io(io) if io.kind() == ErrorKind::ConnectionRefused => {
            Failure::NotSent("refused the connection: is it running?".into())
        }
        ureq::Error::Timeout(ureq::Timeout::Connect | ureq::Timeout::Resolve) => Failure::NotSent(
            "did not accept a connection in time: is it running and reachable?".into(),
        ),
        ureq::Error::HostNotFound => {
            Failure::NotSent("could not be found (name lookup failed): check the endpoint".into())
        }
        ureq::Error::ConnectionFailed => {
            Failure::NotSent("could not be connected to: is it running?".into())
        }
        ureq::Error::BadUri(uri) => Failure::NotSent(format!("has a malformed endpoint {uri}")),
        ureq::Error::Timeout(t) => Failure::Ambiguous(format!("did not answer in time ({t:?})")),
        other => Failure::Ambiguous(format!("lost the connection: {other}")),
    }
}

/// etcd's error answer: `{"error": ..., "message": ..., "code": n}`.
#[derive(Deserialize)]
struct ErrorBody {
    #[serde(default)]
    code: i64,
    #[serde(default)]
    message: String,
}

/// A 64-bit integer, which the gateway writes as a string (and omits when zero).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Num(pub(crate) i64);

impl<'de> Deserialize<'de> for Num {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Text(String),
            Int(i64),
        }
        match Raw::deserialize(d)? {
            Raw::Int(n) => Ok(Num(n)),
            Raw::Text(s) => s.parse().map(Num).map_err(de::Error::custom),
        }
    }
}

/// Bytes, which the gateway writes as base64 (and omits when empty).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Bytes(pub(crate) Vec<u8>);

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        unb64(&text)
            .map(Bytes)
            .ok_or_else(|| de::Error::custom("invalid base64"))
    }
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct Header {
    #[serde(default)]
    pub(crate) revision: Num,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct KeyValue {
    #[serde(default)]
    pub(crate) key: Bytes,
    #[serde(default)]
    pub(crate) value: Bytes,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct RangeResponse {
    #[serde(default)]
    pub(crate) header: Header,
    #[serde(default)]
    pub(crate) kvs: Vec<KeyValue>,
    #[serde(default)]
    pub(crate) more: bool,
    #[serde(default)]
    pub(crate) count: Num,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct ResponseOp {
    #[serde(default)]
    pub(crate) response_range: Option<RangeResponse>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct TxnResponse {
    #[serde(default)]
    pub(crate) header: Header,
    #[serde(default)]
    pub(crate) succeeded: bool,
    #[serde(default)]
    pub(crate) responses: Vec<ResponseOp>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct PutResponse {
    #[serde(default)]
    pub(crate) header: Header,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_gateway_answers() {
        let txn: TxnResponse = serde_json::from_str(
            r#"{"header":{"cluster_id":"1","revision":"2"},"responses":[
                {"response_range":{"header":{"revision":"2"},"kvs":[{"key":"YQ==",
                "create_revision":"2","value":"MQ=="}],"count":"1"}},
                {"response_range":{"header":{"revision":"2"}}}]}"#,
        )
        .unwrap();
        assert!(!txn.succeeded);
        assert_eq!(txn.header.revision, Num(2));
        let first = txn.responses[0].response_range.as_ref().unwrap();
        assert_eq!(first.kvs[0].key, Bytes(b"a".to_vec()));
        assert_eq!(first.kvs[0].value, Bytes(b"1".to_vec()));
        assert_eq!(first.count, Num(1));
        let second = txn.responses[1].response_range.as_ref().unwrap();
        assert_eq!(second.count, Num(0));
        assert!(second.kvs.is_empty() && !second.more);
    }
}
