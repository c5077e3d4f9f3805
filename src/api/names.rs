//! Names, labels and identities shared by the operator and the plugin: one place for each fact.

/// Field manager of every server-side apply the operator makes.
pub const FIELD_MANAGER: &str = "valkey-operator";
/// The operator's name, as it appears in `app.kubernetes.io/managed-by`.
pub const MANAGED_BY: &str = "valkey-operator";
/// Value of `app.kubernetes.io/name` on everything that belongs to a Valkey.
pub const APP_NAME: &str = "valkey";

/// Label keys.
pub mod labels {
    pub const NAME: &str = "app.kubernetes.io/name";
    pub const INSTANCE: &str = "app.kubernetes.io/instance";
    pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
    pub const COMPONENT: &str = "app.kubernetes.io/component";
    /// `primary` or `replica` on each Valkey pod; the read-write Service selects `primary`.
    pub const ROLE: &str = "database.kuberly.io/role";
}

/// Values of [`labels::ROLE`].
pub mod roles {
    pub const PRIMARY: &str = "primary";
    pub const REPLICA: &str = "replica";
}

/// Names of the objects derived from the Valkey `instance`.
#[derive(Clone, Copy, Debug)]
pub struct ObjectNames<'a> {
    instance: &'a str,
}

impl<'a> ObjectNames<'a> {
    pub fn new(instance: &'a str) -> Self {
        Self { instance }
    }

    /// The StatefulSet, the PodDisruptionBudget and the read-write Service.
    pub fn statefulset(&self) -> String {
        self.instance.to_owned()
    }

    pub fn read_write_service(&self) -> String {
        self.instance.to_owned()
    }

    pub fn read_only_service(&self) -> String {
        format!("{}-replicas", self.instance)
    }

    pub fn headless_service(&self) -> String {
        format!("{}-headless", self.instance)
    }

    pub fn pod_disruption_budget(&self) -> String {
        self.instance.to_owned()
    }

    pub fn config_map(&self) -> String {
        format!("{}-config", self.instance)
    }

    /// The Secret the operator generates when `spec.passwordSecret` is absent.
    pub fn generated_secret(&self) -> String {
        format!("{}-auth", self.instance)
    }

    /// The operator-owned Secret holding auth.conf (the ACL and replication credentials): the
    /// password never goes into the ConfigMap.
    pub fn acl_secret(&self) -> String {
        format!("{}-acl", self.instance)
    }

    pub fn pod(&self, ordinal: i32) -> String {
        format!("{}-{ordinal}", self.instance)
    }

    /// The PersistentVolumeClaim of one pod, as the StatefulSet controller names it.
    pub fn volume_claim(&self, ordinal: i32) -> String {
        format!("{}-{}-{ordinal}", DATA_VOLUME, self.instance)
    }
}

/// The ordinal of `pod` when it is a pod of the StatefulSet of `instance` (`<instance>-<n>`), the
/// one parser both binaries use: plain decimal digits only (no sign, no `+`), as the StatefulSet
/// controller writes them, at most 9 of them so the value fits an `i32`.
pub fn pod_ordinal(instance: &str, pod: &str) -> Option<i32> {
    let digits = pod.strip_prefix(instance)?.strip_prefix('-')?;
    let canonical = !digits.is_empty()
        && digits.len() <= 9
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits == "0" || !digits.starts_with('0'));
    canonical.then(|| digits.parse().ok()).flatten()
}

/// The pod ordinal of `claim` when it is a data volume of `instance` (`data-<instance>-<n>`).
pub fn claim_ordinal(instance: &str, claim: &str) -> Option<i32> {
    pod_ordinal(
        instance,
        claim.strip_prefix(DATA_VOLUME)?.strip_prefix('-')?,
    )
}

/// Name of the data volume (and of its volumeClaimTemplate).
pub const DATA_VOLUME: &str = "data";

/// Label selector matching everything that belongs to the Valkey `instance`.
pub fn instance_selector(instance: &str) -> String {
    format!(
        "{}={APP_NAME},{}={instance}",
        labels::NAME,
        labels::INSTANCE
    )
}

/// Label selector matching everything the operator manages, across instances.
pub fn managed_selector() -> String {
    format!(
        "{}={APP_NAME},{}={MANAGED_BY}",
        labels::NAME,
        labels::MANAGED_BY
    )
}
