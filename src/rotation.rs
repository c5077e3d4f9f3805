//! Live password rotation: the pure decision. The instance user's password changes in its Secret;
//! the pods keep running. The operator's record of a rotation is the ACL Secret `<name>-acl`
//! (its `password` and `old-password` files and the [`ROTATION_STARTED_ANNOTATION`]), so a restart of the operator
//! picks a rotation up where it was. The steps, each repeated until every pod did it:
//!
//! 1. the ACL Secret carries both passwords (auth.conf: the user holds both, replication logs in
//!    with the old one; `password`, `old-password`: what the probes log in with), and the
//!    rotation's start time;
//! 2. on every pod, primary first: `ACL SETUSER <user> >new` (the old one stays valid) and
//!    `CONFIG SET masterauth new`;
//! 3. once [`FILE_SYNC_GRACE`] has passed since the start (so the kubelets have written the new
//!    `password` file, which the probes and `kubectl valkey cli` read, into every pod): on
//!    every pod, every other password of the user is removed (`ACL SETUSER <user> !<sha256>`);
//! 4. the ACL Secret carries the new password alone, without the annotation: done.
//!
//! The pod template never changes (the config hash leaves this password out), so no pod rolls.
//!
//! [`ROTATION_STARTED_ANNOTATION`]: crate::api::names::ROTATION_STARTED_ANNOTATION

use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// How long after the ACL Secret first carries the new password the old one may be removed: the
/// kubelet rewrites a mounted Secret at its next sync of the pod, within its `syncFrequency`
/// (60 s by default) plus up to half of it as jitter.
pub const FILE_SYNC_GRACE: Duration = Duration::from_secs(100);

/// What the ACL Secret recorded: its `password` and non-empty `old-password` (newest first) and
/// the start of the rotation in progress, if one is.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Record {
    pub passwords: Vec<String>,
    pub started: Option<Timestamp>,
}

impl std::fmt::Debug for Record {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Record")
            .field("passwords", &self.passwords.len())
            .field("started", &self.started)
            .finish()
    }
}

impl Record {
    /// From the `password` and `old-password` files and the annotation's value (an unreadable
    /// time counts as none: the rotation then starts its clock again, which only delays the
    /// removal).
    pub fn parse(password: &str, old_password: Option<&str>, started: Option<&str>) -> Self {
        let mut passwords = Vec::new();
        for p in [Some(password), old_password].into_iter().flatten() {
            if !p.is_empty() && !passwords.iter().any(|q| q == p) {
                passwords.push(p.to_owned());
            }
        }
        Self {
            passwords,
            started: started.and_then(|s| s.parse().ok()),
        }
    }
}

/// What to do this reconcile.
#[derive(Clone, PartialEq, Eq)]
pub struct Plan {
    /// The password every pod accepts until the end of the rotation (auth.conf keeps it, and
    /// replication uses it at start), when it is not the new one.
    pub old: Option<String>,
    /// The rotation's start, `None` when no rotation runs (nothing to do on the pods).
    pub started: Option<Timestamp>,
    /// The passwords to log in to a pod with, the new one first.
    pub logins: Vec<String>,
    /// Step 3 is due: remove every password but the new one from every pod.
    pub remove_others: bool,
}

impl std::fmt::Debug for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plan")
            .field("old", &self.old.as_ref().map(|_| "<redacted>"))
            .field("started", &self.started)
            .field("logins", &self.logins.len())
            .field("remove_others", &self.remove_others)
            .finish()
    }
}

impl Plan {
    pub fn rotating(&self) -> bool {
        self.started.is_some()
    }

    /// What the ACL Secret records once this reconcile's pod steps are done: `done` says every
    /// pod of the instance took every step due (steps 2 and, when due, 3). Returns (old
    /// password, start) for the builders: both `None` once the rotation is over.
    pub fn after(&self, done: bool) -> (Option<String>, Option<Timestamp>) {
        if self.remove_others && done {
            (None, None)
        } else {
            (self.old.clone(), self.started)
        }
    }
}

/// The decision. `record` is `None` for a new instance (or an ACL Secret written by an older
/// operator, without `password`): the pods start with `password`, nothing to rotate.
pub fn plan(record: Option<&Record>, password: &str, now: Timestamp) -> Plan {
    let steady = Plan {
        old: None,
        started: None,
        logins: vec![password.to_owned()],
        remove_others: false,
    };
    let Some(record) = record else {
        return steady;
    };
    if record.passwords.is_empty() || (record.passwords == [password] && record.started.is_none()) {
        return steady;
    }
    // The oldest recorded password is the one every pod accepted before the rotation began; the
    // pods keep it until the end, whatever happened in between (another new password, a
    // restart of the operator). A password in between is removed at the end like any other.
    let oldest = record.passwords.last().cloned();
    let old = oldest.filter(|o| o != password);
    // The clock runs from when the ACL Secret first carried *this* new password.
    let started = match record.started {
        Some(t) if record.passwords.first().map(String::as_str) == Some(password) => t,
        _ => now,
    };
    let mut logins = vec![password.to_owned()];
    logins.extend(record.passwords.iter().filter(|p| *p != password).cloned());
    let grace = SignedDuration::try_from(FILE_SYNC_GRACE).unwrap_or(SignedDuration::MAX);
    let remove_others = now.duration_since(started) >= grace;
    Plan {
        old,
        started: Some(started),
        logins,
        remove_others,
    }
}

/// How long until step 3 is due (for the requeue), `None` when it is or no rotation runs.
pub fn until_removal(plan: &Plan, now: Timestamp) -> Option<Duration> {
    let started = plan.started?;
    if plan.remove_others {
        return None;
    }
    let elapsed = Duration::try_from(now.duration_since(started)).unwrap_or_default();
    Some(FILE_SYNC_GRACE.saturating_sub(elapsed))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn record(passwords: &[&str], started: Option<&str>) -> Record {
        Record {
            passwords: passwords.iter().map(|p| (*p).to_owned()).collect(),
            started: started.map(t),
        }
    }

    const T0: &str = "2026-12-01T10:00:00Z";

    #[test]
    fn a_new_instance_or_an_old_record_rotates_nothing() {
        let now = t(T0);
        for r in [None, Some(record(&[], None))] {
            let p = plan(r.as_ref(), "new", now);
            assert!(!p.rotating());
            assert_eq!(p.old, None);
            assert_eq!(p.logins, ["new"]);
            assert_eq!(p.after(true), (None, None));
        }
    }

    #[test]
    fn the_recorded_password_is_steady() {
        let p = plan(Some(&record(&["pw"], None)), "pw", t(T0));
        assert!(!p.rotating());
        assert!(!p.remove_others);
    }

    #[test]
    fn a_new_password_starts_a_rotation_that_keeps_the_old_one() {
        let now = t(T0);
        let p = plan(Some(&record(&["old"], None)), "new", now);
        assert_eq!(p.old.as_deref(), Some("old"));
        assert_eq!(p.started, Some(now));
        assert_eq!(p.logins, ["new", "old"]);
        assert!(
            !p.remove_others,
            "the old password stays until the files are synced"
        );
        // Not done yet, whatever the pods did: the record keeps both passwords.
        assert_eq!(p.after(true), (Some("old".to_owned()), Some(now)));
        assert_eq!(until_removal(&p, now), Some(FILE_SYNC_GRACE));
    }

    #[test]
    fn the_old_password_goes_only_after_the_grace_and_when_every_pod_did_it() {
        let started = t(T0);
        let r = record(&["new", "old"], Some(T0));
        let early = plan(Some(&r), "new", t("2026-12-01T10:01:00Z"));
        assert_eq!(early.started, Some(started), "the clock survives a restart");
        assert!(!early.remove_others);
        assert_eq!(
            until_removal(&early, t("2026-12-01T10:01:00Z")),
            Some(Duration::from_secs(40))
        );
        let due = plan(Some(&r), "new", t("2026-12-01T10:01:40Z"));
        assert!(due.remove_others);
        assert_eq!(until_removal(&due, t("2026-12-01T10:01:40Z")), None);
        // A pod that could not be reached keeps the rotation open...
        assert_eq!(due.after(false), (Some("old".to_owned()), Some(started)));
        // ... and once every pod dropped the old password, the record is the new one alone.
        assert_eq!(due.after(true), (None, None));
    }

    #[test]
    fn another_new_password_mid_rotation_restarts_the_clock_and_keeps_the_oldest() {
        let now = t("2026-12-01T10:01:30Z");
        let p = plan(Some(&record(&["second", "first"], Some(T0))), "third", now);
        assert_eq!(p.old.as_deref(), Some("first"));
        assert_eq!(p.started, Some(now));
        assert_eq!(p.logins, ["third", "second", "first"]);
        assert!(!p.remove_others);
    }

    #[test]
    fn going_back_to_the_old_password_still_removes_the_other_one() {
        let p = plan(
            Some(&record(&["new", "old"], Some(T0))),
            "old",
            t("2026-12-01T10:00:10Z"),
        );
        assert!(
            p.rotating(),
            "the pods may hold the other password: clean up"
        );
        assert_eq!(
            p.old, None,
            "the password the pods run with is the wanted one"
        );
        assert_eq!(p.logins, ["old", "new"]);
        assert_eq!(p.started, Some(t("2026-12-01T10:00:10Z")));
    }

    #[test]
    fn a_record_left_with_only_the_new_password_and_a_start_finishes_the_clean_up() {
        // E.g. a rotation back to the old password, recorded: the pods may still hold another.
        let p = plan(
            Some(&record(&["pw"], Some(T0))),
            "pw",
            t("2026-12-01T10:05:00Z"),
        );
        assert!(p.rotating());
        assert!(p.remove_others);
        assert_eq!(p.after(true), (None, None));
    }

    #[test]
    fn parse_reads_both_files_and_a_bad_time_as_none() {
        let r = Record::parse("new\nline", Some("old"), Some("yesterday"));
        assert_eq!(r.passwords, ["new\nline", "old"]);
        assert_eq!(r.started, None);
        let steady = Record::parse("pw", Some(""), Some(T0));
        assert_eq!(steady.passwords, ["pw"]);
        assert_eq!(steady.started, Some(t(T0)));
    }

    #[test]
    fn debug_shows_no_password() {
        let p = plan(Some(&record(&["s3cret-old"], None)), "s3cret-new", t(T0));
        let text = format!("{p:?} {:?}", record(&["s3cret-old"], None));
        assert!(!text.contains("s3cret"), "{text}");
    }
}
