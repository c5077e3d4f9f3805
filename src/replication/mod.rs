//! Talking to the Valkey pods of an instance as the operator's own ACL user
//! ([`OPERATOR_USER`]): PING, `INFO replication` / `INFO keyspace`, `REPLICAOF`, `FAILOVER`,
//! `CONFIG GET/SET`, `CLIENT KILL`. Over the `redis` crate with tokio; every call is bounded by
//! a timeout, so a hung server costs a bounded wait, never a stuck reconcile.

mod info;

use std::fmt;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{
    AsyncConnectionConfig, Client, ConnectionAddr, IntoConnectionInfo, RedisConnectionInfo,
};

use crate::api::names::OPERATOR_USER;

pub use info::{Info, Role, parse_info};

/// Why a pod could not be talked to. Never carries the password.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{addr}: {source}")]
    Redis {
        addr: String,
        #[source]
        source: redis::RedisError,
    },
    #[error("{addr}: no answer within {timeout:?}")]
    Timeout { addr: String, timeout: Duration },
    #[error("{addr}: unexpected answer to {command}: {answer}")]
    Unexpected {
        addr: String,
        command: &'static str,
        answer: String,
    },
}

/// How to reach a pod: address (pod IP or host name), port, and the operator's password.
#[derive(Clone)]
pub struct Target {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: String,
    /// Bound on connecting and on each answer.
    pub timeout: Duration,
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Target")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl Target {
    /// The pod at `host` as [`OPERATOR_USER`].
    pub fn operator(host: impl Into<String>, port: u16, password: &str, timeout: Duration) -> Self {
        Self {
            host: host.into(),
            port,
            user: OPERATOR_USER.to_owned(),
            password: password.to_owned(),
            timeout,
        }
    }

    fn addr(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

/// One authenticated connection to one pod (multiplexed: cheap to clone and keep).
#[derive(Clone)]
pub struct Conn {
    conn: MultiplexedConnection,
    addr: String,
    timeout: Duration,
}

impl fmt::Debug for Conn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Conn").field("addr", &self.addr).finish()
    }
}

/// The answer to `FAILOVER`: done, or refused by the server (with its words).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FailoverStarted {
    Started,
    Refused(String),
}

impl Conn {
    /// Connects and logs in; fails within `target.timeout`.
    pub async fn open(target: &Target) -> Result<Self, Error> {
        let addr = target.addr();
        let redis_err = |source| Error::Redis {
            addr: addr.clone(),
            source,
        };
        let info = ConnectionAddr::Tcp(target.host.clone(), target.port)
            .into_connection_info()
            .map_err(redis_err)?
            .set_redis_settings(
                RedisConnectionInfo::default()
                    .set_username(&target.user)
                    .set_password(&target.password)
                    .set_skip_set_lib_name(),
            );
        let client = Client::open(info).map_err(redis_err)?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(target.timeout))
            .set_response_timeout(Some(target.timeout));
        let connecting = client.get_multiplexed_async_connection_with_config(&config);
        // The crate's own timeouts cover connect and each answer; this one also bounds the
        // login round trip as a whole.
        let conn = match tokio::time::timeout(target.timeout * 2, connecting).await {
            Ok(conn) => conn.map_err(redis_err)?,
            Err(_) => {
                return Err(Error::Timeout {
                    addr,
                    timeout: target.timeout,
                });
            }
        };
        Ok(Self {
            conn,
            addr,
            timeout: target.timeout,
        })
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, Error> {
        let mut conn = self.conn.clone();
        match tokio::time::timeout(self.timeout, cmd.query_async::<T>(&mut conn)).await {
            Ok(result) => result.map_err(|source| Error::Redis {
                addr: self.addr.clone(),
                source,
            }),
            Err(_) => Err(Error::Timeout {
                addr: self.addr.clone(),
                timeout: self.timeout,
            }),
        }
    }

    /// PING: the server answers commands.
    pub async fn ping(&self) -> Result<(), Error> {
        let answer: String = self.query(&redis::cmd("PING")).await?;
        if answer == "PONG" {
            Ok(())
        } else {
            Err(Error::Unexpected {
                addr: self.addr.clone(),
                command: "PING",
                answer,
            })
        }
    }

    /// `INFO replication` and `INFO keyspace`, parsed.
    pub async fn info(&self) -> Result<Info, Error> {
        let text: String = self
            .query(redis::cmd("INFO").arg("replication").arg("keyspace"))
            .await?;
        Ok(parse_info(&text))
    }

    /// `REPLICAOF NO ONE`: this pod becomes a primary, keeping its dataset.
    pub async fn promote(&self) -> Result<(), Error> {
        self.ok("REPLICAOF", redis::cmd("REPLICAOF").arg("NO").arg("ONE"))
            .await
    }

    /// `REPLICAOF host port`: this pod follows `host`.
    pub async fn replicate_from(&self, host: &str, port: u16) -> Result<(), Error> {
        self.ok("REPLICAOF", redis::cmd("REPLICAOF").arg(host).arg(port))
            .await
    }

    /// `FAILOVER TO host port TIMEOUT ms` on the primary: Valkey pauses writers, waits for the
    /// replica to catch up and swaps the roles. Returns once the server accepted it; the swap
    /// itself completes asynchronously (watch `INFO replication`'s role).
    pub async fn failover_to(
        &self,
        host: &str,
        port: u16,
        timeout: Duration,
    ) -> Result<FailoverStarted, Error> {
        let millis = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        let mut cmd = redis::cmd("FAILOVER");
        cmd.arg("TO").arg(host).arg(port).arg("TIMEOUT").arg(millis);
        match self.query::<String>(&cmd).await {
            Ok(answer) if answer == "OK" => Ok(FailoverStarted::Started),
            Ok(answer) => Err(Error::Unexpected {
                addr: self.addr.clone(),
                command: "FAILOVER",
                answer,
            }),
            // The server said no (not a primary, a failover already running, no such replica).
            Err(Error::Redis { source, .. }) if source.code().is_some() => {
                Ok(FailoverStarted::Refused(source.to_string()))
            }
            Err(e) => Err(e),
        }
    }

    /// `CLIENT PAUSE ms WRITE`: write commands of ordinary clients wait (replication and reads
    /// go on) until `pause` has passed or their connection is killed.
    pub async fn pause_writes(&self, pause: Duration) -> Result<(), Error> {
        let millis = u64::try_from(pause.as_millis()).unwrap_or(u64::MAX);
        self.ok(
            "CLIENT PAUSE",
            redis::cmd("CLIENT").arg("PAUSE").arg(millis).arg("WRITE"),
        )
        .await
    }

    /// `CONFIG GET key`: its value, if the server knows the directive.
    pub async fn config_get(&self, key: &str) -> Result<Option<String>, Error> {
        let pairs: Vec<String> = self.query(redis::cmd("CONFIG").arg("GET").arg(key)).await?;
        Ok(pairs
            .chunks(2)
            .find(|p| p.first().map(String::as_str) == Some(key))
            .and_then(|p| p.get(1).cloned()))
    }

    /// `CONFIG SET key value`.
    pub async fn config_set(&self, key: &str, value: &str) -> Result<(), Error> {
        self.ok(
            "CONFIG SET",
            redis::cmd("CONFIG").arg("SET").arg(key).arg(value),
        )
        .await
    }

    /// `CLIENT KILL TYPE normal`: drops every ordinary client (never this connection, nor
    /// replicas); returns how many.
    pub async fn kill_normal_clients(&self) -> Result<i64, Error> {
        self.query(
            redis::cmd("CLIENT")
                .arg("KILL")
                .arg("TYPE")
                .arg("normal")
                .arg("SKIPME")
                .arg("yes"),
        )
        .await
    }

    /// `CONFIG SET masterauth password`: how this pod logs in to its primary from its next sync
    /// on (a link that is up stays up).
    pub async fn set_masterauth(&self, password: &str) -> Result<(), Error> {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("SET").arg("masterauth").arg(password);
        self.ok_quiet("CONFIG SET masterauth", &cmd).await
    }

    /// `ACL SETUSER user >password`: the user also accepts `password` (its others stay). The
    /// server's words are dropped from the error: they could quote the password.
    pub async fn acl_add_password(&self, user: &str, password: &str) -> Result<(), Error> {
        let mut cmd = redis::cmd("ACL");
        cmd.arg("SETUSER").arg(user).arg(format!(">{password}"));
        self.ok_quiet("ACL SETUSER", &cmd).await
    }

    /// `ACL SETUSER user !<sha256>`: the user no longer accepts the password of that hash.
    pub async fn acl_remove_password_hash(&self, user: &str, hash: &str) -> Result<(), Error> {
        let mut cmd = redis::cmd("ACL");
        cmd.arg("SETUSER").arg(user).arg(format!("!{hash}"));
        self.ok_quiet("ACL SETUSER", &cmd).await
    }

    /// The SHA-256 (hex) of each password `user` accepts (`ACL GETUSER`'s `passwords`).
    pub async fn acl_password_hashes(&self, user: &str) -> Result<Vec<String>, Error> {
        let answer: redis::Value = self
            .query(redis::cmd("ACL").arg("GETUSER").arg(user))
            .await?;
        let pairs: Vec<(redis::Value, redis::Value)> = match answer {
            redis::Value::Array(items) => {
                let mut items = items.into_iter();
                let mut pairs = Vec::new();
                while let (Some(k), Some(v)) = (items.next(), items.next()) {
                    pairs.push((k, v));
                }
                pairs
            }
            redis::Value::Map(pairs) => pairs,
            other => {
                return Err(Error::Unexpected {
                    addr: self.addr.clone(),
                    command: "ACL GETUSER",
                    answer: format!("{:?}", std::mem::discriminant(&other)),
                });
            }
        };
        let text = |v: &redis::Value| match v {
            redis::Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
            redis::Value::SimpleString(s) => Some(s.clone()),
            _ => None,
        };
        let hashes = pairs
            .iter()
            .find(|(k, _)| text(k).as_deref() == Some("passwords"))
            .map(|(_, v)| match v {
                redis::Value::Array(list) | redis::Value::Set(list) => {
                    list.iter().filter_map(text).collect()
                }
                _ => Vec::new(),
            });
        hashes.ok_or_else(|| Error::Unexpected {
            addr: self.addr.clone(),
            command: "ACL GETUSER",
            answer: "no passwords field (no such user?)".to_owned(),
        })
    }

    /// Like [`Self::ok`], but a refusal is reported without the server's words.
    async fn ok_quiet(&self, command: &'static str, cmd: &redis::Cmd) -> Result<(), Error> {
        match self.query::<String>(cmd).await {
            Ok(answer) if answer == "OK" => Ok(()),
            Ok(_) | Err(Error::Redis { .. }) => Err(Error::Unexpected {
                addr: self.addr.clone(),
                command,
                answer: "refused (the server's words are withheld: they may quote a password)"
                    .to_owned(),
            }),
            Err(e) => Err(e),
        }
    }

    async fn ok(&self, command: &'static str, cmd: &redis::Cmd) -> Result<(), Error> {
        let answer: String = self.query(cmd).await?;
        if answer == "OK" {
            Ok(())
        } else {
            Err(Error::Unexpected {
                addr: self.addr.clone(),
                command,
                answer,
            })
        }
    }
}
