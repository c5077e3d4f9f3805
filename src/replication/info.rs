//! `INFO replication` and `INFO keyspace`, parsed into the facts the failover decision needs.

/// The role a server reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Primary,
    Replica,
}

/// What `INFO replication` (and `INFO keyspace`) said.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Info {
    /// `role`; `None` when the text had no role line.
    pub role: Option<Role>,
    /// `master_host` / `master_port` of a replica.
    pub primary_host: Option<String>,
    pub primary_port: Option<u16>,
    /// `master_link_status:up`.
    pub link_up: bool,
    /// `master_sync_in_progress:1`.
    pub sync_in_progress: bool,
    /// A replica's `slave_repl_offset`, or a primary's `master_repl_offset`.
    pub offset: i64,
    /// `connected_slaves`.
    pub connected_replicas: u32,
    /// Replicas the primary lists as `state=online`.
    pub online_replicas: u32,
    /// `master_failover_state` (`no-failover` when none runs).
    pub failover_state: Option<String>,
    /// Keys over every database (`INFO keyspace`).
    pub keys: u64,
}

impl Info {
    /// Has received a replication stream from a primary: its link is up, or it holds an offset
    /// beyond the start (a replica that never synced reports 0 or 1... see the tests against a
    /// real server in tests/replication.rs).
    pub fn has_synced(&self) -> bool {
        match self.role {
            Some(Role::Replica) => self.link_up || (!self.sync_in_progress && self.offset > 1),
            Some(Role::Primary) => true,
            None => false,
        }
    }
}

/// Parses the text of `INFO` (any sections; unknown lines are ignored).
pub fn parse_info(text: &str) -> Info {
    let mut info = Info::default();
    let mut primary_offset = 0;
    let mut replica_offset = None;
    for line in text.lines() {
        let line = line.trim_end_matches('\r');
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        match key {
            "role" => {
                info.role = match value {
                    "master" => Some(Role::Primary),
                    "slave" => Some(Role::Replica),
                    _ => None,
                }
            }
            "master_host" => info.primary_host = Some(value.to_owned()),
            "master_port" => info.primary_port = value.parse().ok(),
            "master_link_status" => info.link_up = value == "up",
            "master_sync_in_progress" => info.sync_in_progress = value == "1",
            "slave_repl_offset" => replica_offset = value.parse().ok(),
            "master_repl_offset" => primary_offset = value.parse().unwrap_or(0),
            "connected_slaves" => info.connected_replicas = value.parse().unwrap_or(0),
            "master_failover_state" => info.failover_state = Some(value.to_owned()),
            _ if key.starts_with("slave")
                && key[5..].bytes().all(|b| b.is_ascii_digit())
                && value.split(',').any(|field| field == "state=online") =>
            {
                info.online_replicas += 1;
            }
            _ if key.starts_with("db") && key[2..].bytes().all(|b| b.is_ascii_digit()) => {
                let keys = value
                    .split(',')
                    .find_map(|field| field.strip_prefix("keys="))
                    .and_then(|n| n.parse::<u64>().ok())
                    .unwrap_or(0);
                info.keys = info.keys.saturating_add(keys);
            }
            _ => {}
        }
    }
    info.offset = match info.role {
        Some(Role::Replica) => replica_offset.unwrap_or(0),
        _ => primary_offset,
    };
    info
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_and_its_keyspace() {
        let text = "# Replication\r\nrole:slave\r\nmaster_host:cache-0.cache-headless.ns.svc.cluster.local\r\nmaster_port:6379\r\nmaster_link_status:up\r\nmaster_last_io_seconds_ago:1\r\nmaster_sync_in_progress:0\r\nslave_read_repl_offset:1234\r\nslave_repl_offset:1234\r\nconnected_slaves:0\r\nmaster_failover_state:no-failover\r\nmaster_repl_offset:1234\r\n\r\n# Keyspace\r\ndb0:keys=3,expires=0,avg_ttl=0\r\ndb2:keys=4,expires=1,avg_ttl=7\r\n";
        let info = parse_info(text);
        assert_eq!(info.role, Some(Role::Replica));
        assert_eq!(
            info.primary_host.as_deref(),
            Some("cache-0.cache-headless.ns.svc.cluster.local")
        );
        assert_eq!(info.primary_port, Some(6379));
        assert!(info.link_up && !info.sync_in_progress && info.has_synced());
        assert_eq!(info.offset, 1234);
        assert_eq!(info.keys, 7);
    }

    #[test]
    fn a_primary_with_replicas() {
        let text = "role:master\nconnected_slaves:2\nslave0:ip=10.0.0.2,port=6379,state=online,offset=99,lag=0\nslave1:ip=10.0.0.3,port=6379,state=wait_bgsave,offset=0,lag=0\nmaster_failover_state:no-failover\nmaster_repl_offset:99\n";
        let info = parse_info(text);
        assert_eq!(info.role, Some(Role::Primary));
        assert_eq!((info.connected_replicas, info.online_replicas), (2, 1));
        assert_eq!(info.offset, 99);
        assert_eq!(info.keys, 0);
    }
}
