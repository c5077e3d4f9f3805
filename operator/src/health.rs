//! The health loop: about once a second, a PING to every instance's primary on a kept
//! connection (as the operator's own ACL user, bounded by a short timeout), so a hung or cut-off
//! primary is noticed without waiting for the kubelet's probes or the node monitor. A change
//! (a primary stops answering, or answers again) triggers a reconcile of its instance, which
//! observes every pod and decides; the loop itself never acts.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::mpsc;
use tracing::debug;
use valkey_core::api::Valkey;
use valkey_core::reconcile::failover::Memory;
use valkey_core::replication::Conn;

/// How often each primary is asked.
pub const PERIOD: Duration = Duration::from_secs(1);

/// Runs until `shutdown` resolves.
pub async fn run(
    memory: Arc<Memory>,
    trigger: mpsc::Sender<ObjectRef<Valkey>>,
    shutdown: impl Future<Output = ()>,
) {
    let mut conns: HashMap<(String, String), (String, Conn)> = HashMap::new();
    let mut ticks = tokio::time::interval(PERIOD);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            _ = ticks.tick() => {}
        }
        let primaries = memory.primaries();
        conns.retain(|key, _| primaries.iter().any(|(k, _)| k == key));
        let checks = primaries.into_iter().map(|(key, primary)| {
            // A kept connection to this very host, or a new one.
            let kept = conns
                .get(&key)
                .filter(|(host, _)| *host == primary.target.host)
                .map(|(_, c)| c.clone());
            async move {
                let conn = match kept {
                    Some(c) => Some(c),
                    None => Conn::open(&primary.target).await.ok(),
                };
                let answered = match &conn {
                    Some(c) => c.ping().await.is_ok(),
                    None => false,
                };
                (key, primary, conn.filter(|_| answered), answered)
            }
        });
        // Pods that were silent at the last reconcile: one that answers again (an old primary
        // after a hang or a partition) gets its instance reconciled, so it is repointed.
        let returning = memory
            .silent_pods()
            .into_iter()
            .map(|(key, pod)| async move {
                let answered = match Conn::open(&pod.target).await {
                    Ok(c) => c.ping().await.is_ok(),
                    Err(_) => false,
                };
                (key, pod, answered)
            });
        let (results, returned) = futures::join!(join_all(checks), join_all(returning));
        for ((namespace, instance), pod, answered) in returned {
            if answered {
                debug!(%namespace, %instance, pod = %pod.pod, "a silent pod answers again");
                memory.answered_again(&namespace, &instance, &pod.pod);
                let _ = trigger.try_send(ObjectRef::new(&instance).within(&namespace));
            }
        }
        let now = Instant::now();
        for (key, primary, conn, answered) in results {
            match conn {
                Some(c) => {
                    conns.insert(key.clone(), (primary.target.host.clone(), c));
                }
                None => {
                    conns.remove(&key);
                }
            }
            let (namespace, instance) = &key;
            if memory.ping_result(namespace, &primary, answered, now) {
                debug!(%namespace, %instance, pod = %primary.pod, answered, "primary health changed");
                let _ = trigger.try_send(ObjectRef::new(instance).within(namespace));
            }
        }
    }
}
