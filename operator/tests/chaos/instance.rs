//! A Valkey instance as the chaos suite sees it from the host: its pods (straight to their pod
//! IPs), its Services (their ClusterIPs, through kube-proxy), its password (read from its Secret
//! through the API, kept in memory) and the checks that must hold after every scenario.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::ListParams;
use valkey_core::api::Valkey;
use valkey_core::api::defaults;
use valkey_core::api::names::ObjectNames;
use valkey_core::desired::{CONTAINER, PORT};

use crate::harness::Env;
use crate::observe;
use crate::traffic::{self, Target};

pub struct Instance {
    pub name: String,
    pub replicas: usize,
    /// The instance's ACL user and password, to reach any pod or Service.
    pub auth: Target,
}

/// One pod's answer to `INFO replication`, asked at its pod IP.
#[derive(Clone, Debug)]
pub struct PodView {
    pub name: String,
    pub ip: Option<String>,
    pub node: Option<String>,
    pub uid: String,
    pub container_id: Option<String>,
    pub ready: bool,
    pub deleting: bool,
    /// `INFO replication`, or why it could not be read.
    pub info: Result<BTreeMap<String, String>, String>,
}

impl PodView {
    pub fn role(&self) -> Option<&str> {
        self.info.as_ref().ok()?.get("role").map(String::as_str)
    }

    pub fn link_up(&self) -> bool {
        self.info
            .as_ref()
            .ok()
            .and_then(|i| i.get("master_link_status"))
            .is_some_and(|s| s == "up")
    }
}

impl Instance {
    pub async fn new(env: &Env, name: &str, replicas: usize) -> Self {
        let valkey = observe::get(env, name).await;
        let names = ObjectNames::new(name);
        let (secret, key) = match &valkey.spec.password_secret {
            Some(s) => (s.name.clone(), s.key.clone()),
            None => (names.generated_secret(), defaults::PASSWORD_KEY.to_owned()),
        };
        let password = observe::secret_value(env, &secret, &key).await;
        let user = valkey.spec.user.clone();
        Self {
            name: name.to_owned(),
            replicas,
            auth: Target {
                host: String::new(),
                port: PORT as u16,
                user,
                password,
            },
        }
    }

    pub fn names(&self) -> ObjectNames<'_> {
        ObjectNames::new(&self.name)
    }

    async fn cluster_ip(&self, env: &Env, service: &str) -> Result<Target, String> {
        let svc = env
            .api::<Service>()
            .get(service)
            .await
            .map_err(|e| format!("reading Service {service}: {e}"))?;
        let ip = svc
            .spec
            .and_then(|s| s.cluster_ip)
            .filter(|ip| ip != "None")
            .ok_or_else(|| format!("Service {service} has no ClusterIP"))?;
        Ok(self.auth.at(&ip, PORT as u16))
    }

    /// The read-write Service's ClusterIP.
    pub async fn read_write(&self, env: &Env) -> Result<Target, String> {
        self.cluster_ip(env, &self.names().read_write_service())
            .await
    }

    /// The read-only Service's ClusterIP.
    pub async fn read_only(&self, env: &Env) -> Result<Target, String> {
        self.cluster_ip(env, &self.names().read_only_service())
            .await
    }

    pub async fn pods(&self, env: &Env) -> BTreeMap<String, Pod> {
        observe::pods(env, &self.name).await
    }

    /// Every pod of the instance, with its own answer to `INFO replication` (2 s per pod).
    pub async fn views(&self, env: &Env) -> Vec<PodView> {
        let mut views = Vec::new();
        for (name, pod) in self.pods(env).await {
            let ip = observe::pod_ip(&pod);
            let status = pod.status.as_ref();
            let ready = status
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            let container_id = status
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.name == CONTAINER))
                .and_then(|c| c.container_id.clone());
            let info = match &ip {
                None => Err("no pod IP".to_owned()),
                Some(ip) => match self
                    .auth
                    .at(ip, PORT as u16)
                    .connect(Duration::from_secs(2))
                    .await
                {
                    Ok(mut conn) => traffic::info(&mut conn, "replication").await,
                    Err(e) => Err(e),
                },
            };
            views.push(PodView {
                name,
                ip,
                node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
                uid: pod.uid().unwrap_or_default(),
                container_id,
                ready,
                deleting: pod.metadata.deletion_timestamp.is_some(),
                info,
            });
        }
        views
    }

    /// The one pod that answers `role:master`, or why there is not exactly one.
    pub async fn primary(&self, env: &Env) -> Result<PodView, String> {
        let views = self.views(env).await;
        let masters: Vec<&PodView> = views
            .iter()
            .filter(|v| v.role() == Some("master"))
            .collect();
        match masters.as_slice() {
            [one] => Ok((*one).clone()),
            _ => Err(format!(
                "{} pods answer role:master: {}",
                masters.len(),
                describe(&views)
            )),
        }
    }

    /// The pods behind the read-write Service, by name, from its EndpointSlices (every endpoint,
    /// ready or not).
    pub async fn read_write_endpoints(&self, env: &Env) -> Result<BTreeSet<String>, String> {
        let service = self.names().read_write_service();
        let slices = env
            .api::<EndpointSlice>()
            .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={service}")))
            .await
            .map_err(|e| format!("listing EndpointSlices: {e}"))?;
        let mut pods = BTreeSet::new();
        for endpoint in slices
            .items
            .into_iter()
            .flat_map(|s| s.endpoints.unwrap_or_default())
        {
            let name = endpoint
                .target_ref
                .and_then(|t| t.name)
                .unwrap_or_else(|| endpoint.addresses.join(","));
            let ready = endpoint.conditions.and_then(|c| c.ready).unwrap_or(false);
            pods.insert(if ready {
                name
            } else {
                format!("{name} (not ready)")
            });
        }
        Ok(pods)
    }

    /// The checks after a scenario, all at once; `Err` says the first that does not hold:
    /// - exactly one pod answers role:master, and it is Ready;
    /// - the read-write Service's EndpointSlices hold exactly that pod, ready;
    /// - every other pod answers role:slave with master_link_status:up, and the primary lists
    ///   each of them as an online replica (so `old_primary`, when given, has rejoined);
    /// - status.primary names that pod.
    pub async fn settled(&self, env: &Env, old_primary: Option<&str>) -> Result<Settled, String> {
        let views = self.views(env).await;
        if views.len() != self.replicas {
            return Err(format!(
                "{} pods, expected {}: {}",
                views.len(),
                self.replicas,
                describe(&views)
            ));
        }
        let masters: Vec<&PodView> = views
            .iter()
            .filter(|v| v.role() == Some("master"))
            .collect();
        let [primary] = masters.as_slice() else {
            return Err(format!(
                "{} pods answer role:master: {}",
                masters.len(),
                describe(&views)
            ));
        };
        if !primary.ready || primary.deleting {
            return Err(format!("the primary {} is not Ready", primary.name));
        }
        let endpoints = self.read_write_endpoints(env).await?;
        if endpoints != BTreeSet::from([primary.name.clone()]) {
            return Err(format!(
                "the read-write Service's endpoints are {endpoints:?}, expected only {}",
                primary.name
            ));
        }
        let primary_info = primary.info.as_ref().map_err(Clone::clone)?;
        let online: BTreeSet<String> = primary_info
            .iter()
            .filter(|(k, _)| k.starts_with("slave") && k[5..].chars().all(|c| c.is_ascii_digit()))
            .filter(|(_, v)| v.contains("state=online"))
            .filter_map(|(_, v)| {
                v.split(',')
                    .find_map(|kv| kv.strip_prefix("ip="))
                    .map(str::to_owned)
            })
            .collect();
        for replica in views.iter().filter(|v| v.name != primary.name) {
            if replica.role() != Some("slave") || !replica.link_up() {
                return Err(format!(
                    "{} is not a replica with its link up: {}",
                    replica.name,
                    describe(std::slice::from_ref(replica))
                ));
            }
            let ip = replica.ip.clone().unwrap_or_default();
            if !online.contains(&ip) {
                return Err(format!(
                    "the primary {} does not list {} ({ip}) as an online replica: {online:?}",
                    primary.name, replica.name
                ));
            }
        }
        if let Some(old) = old_primary
            && old != primary.name
            && !views.iter().any(|v| v.name == old)
        {
            return Err(format!("the old primary {old} is gone"));
        }
        let valkey = observe::get(env, &self.name).await;
        let recorded = valkey.status.as_ref().and_then(|s| s.primary.clone());
        if recorded.as_deref() != Some(primary.name.as_str()) {
            return Err(format!(
                "status.primary is {recorded:?}, but {} answers role:master",
                primary.name
            ));
        }
        Ok(Settled {
            primary: primary.name.clone(),
            primary_ip: primary.ip.clone().unwrap_or_default(),
            valkey,
        })
    }

    /// The operator's events about this Valkey last seen at or after `since` (this host's clock,
    /// which the API server shares), oldest first.
    pub async fn events_since(&self, env: &Env, valkey: &Valkey, since: Timestamp) -> Vec<Event> {
        let mut events: Vec<Event> = observe::operator_events(env, valkey)
            .await
            .into_iter()
            .filter(|e| event_time(e).is_some_and(|t| t >= since))
            .collect();
        events.sort_by_key(event_time);
        events
    }
}

pub struct Settled {
    pub primary: String,
    pub primary_ip: String,
    pub valkey: Valkey,
}

/// The time of the latest occurrence of an event.
pub fn event_time(e: &Event) -> Option<Timestamp> {
    let series = e.series.as_ref().map(|s| s.last_observed_time.0);
    series
        .or_else(|| e.event_time.as_ref().map(|t| t.0))
        .or_else(|| e.deprecated_last_timestamp.as_ref().map(|t| t.0))
}

pub fn describe(views: &[PodView]) -> String {
    views
        .iter()
        .map(|v| {
            let info = match &v.info {
                Ok(i) => format!(
                    "role={} link={} master_host={}",
                    i.get("role").map(String::as_str).unwrap_or("?"),
                    i.get("master_link_status")
                        .map(String::as_str)
                        .unwrap_or("-"),
                    i.get("master_host").map(String::as_str).unwrap_or("-"),
                ),
                Err(e) => format!("unreachable ({e})"),
            };
            format!(
                "{} [{} ready={} node={}] {info}",
                v.name,
                v.ip.as_deref().unwrap_or("no ip"),
                v.ready,
                v.node.as_deref().unwrap_or("?")
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Who answered `role:master`, and when: every 200 ms each pod of the instance is asked at its
/// pod IP (`INFO replication`, 1 s deadline). Tells when another pod than the old primary became
/// a primary (the start of the fencing window) and how long two pods answered as primaries.
pub struct RoleWatcher {
    /// (suite clock seconds, pods answering role:master then).
    pub samples: crate::traffic::Journal<(f64, Vec<String>)>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl RoleWatcher {
    pub fn start(env: &Env, instance: &Instance, clock: crate::traffic::Clock) -> Self {
        use std::sync::atomic::Ordering;
        let samples = crate::traffic::Journal::default();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let pods = env.api::<Pod>();
        let selector = valkey_core::api::names::instance_selector(&instance.name);
        let auth = instance.auth.clone();
        let (journal, stopping) = (samples.clone(), stop.clone());
        let task = tokio::spawn(async move {
            while !stopping.load(Ordering::SeqCst) {
                let t = clock.now();
                let listed = pods.list(&ListParams::default().labels(&selector)).await;
                let mut masters = Vec::new();
                for pod in listed.map(|l| l.items).unwrap_or_default() {
                    let Some(ip) = observe::pod_ip(&pod) else {
                        continue;
                    };
                    let asked = async {
                        let mut conn = auth
                            .at(&ip, PORT as u16)
                            .connect(Duration::from_secs(1))
                            .await?;
                        traffic::info(&mut conn, "replication").await
                    };
                    if let Ok(Ok(info)) = tokio::time::timeout(Duration::from_secs(1), asked).await
                        && info.get("role").map(String::as_str) == Some("master")
                    {
                        masters.push(pod.name_any());
                    }
                }
                journal.push((t, masters));
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        Self {
            samples,
            stop,
            task,
        }
    }

    pub async fn stop(self) -> Vec<(f64, Vec<String>)> {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let _ = self.task.await;
        self.samples.snapshot()
    }
}

/// The first sample time at or after `from` when a pod other than `old` answered role:master.
pub fn promoted_at(samples: &[(f64, Vec<String>)], old: &str, from: f64) -> Option<f64> {
    samples
        .iter()
        .find(|(t, masters)| *t >= from && masters.iter().any(|m| m != old))
        .map(|(t, _)| *t)
}

/// How long (summed over the samples' intervals) two or more pods answered role:master.
pub fn two_primaries(samples: &[(f64, Vec<String>)]) -> f64 {
    samples
        .windows(2)
        .filter(|w| w[0].1.len() >= 2)
        .map(|w| w[1].0 - w[0].0)
        .fold(0.0, |a, b| a + b)
}
