//! "Does the live object already say everything we want to say?" The API server fills in
//! defaults and other managers add fields, so equality is the wrong test; containment is.

use serde_json::Value;

/// Whether every field set in `desired` has the same value in `live`. Lists must match element
/// by element (the API server keeps our order). Empty desired lists and maps match absent ones.
/// Quantities match by value ("1024Mi" is "1Gi"), as the API server normalizes them, but only
/// where Kubernetes has quantities (resource requests and limits, `sizeLimit`): elsewhere "1"
/// and "1000m" are different strings, e.g. in a nodeSelector.
pub fn is_subset(desired: &Value, live: &Value) -> bool {
    subset(desired, live, Field::Plain)
}

/// What kind of value a field holds, from its key.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Field {
    Plain,
    /// A map whose values are quantities (`requests`, `limits`).
    QuantityMap,
    Quantity,
}

impl Field {
    fn of_child(self, key: &str) -> Field {
        match (self, key) {
            (Field::QuantityMap, _) | (_, "sizeLimit") => Field::Quantity,
            (_, "requests" | "limits") => Field::QuantityMap,
            _ => Field::Plain,
        }
    }
}

fn subset(desired: &Value, live: &Value, field: Field) -> bool {
    match (desired, live) {
        (Value::Null, _) => true,
        (Value::Object(d), Value::Object(l)) => d.iter().all(|(k, dv)| match l.get(k) {
            Some(lv) => subset(dv, lv, field.of_child(k)),
            None => is_empty(dv),
        }),
        (Value::Object(d), Value::Null) => d.is_empty(),
        (Value::Array(d), Value::Array(l)) => {
            d.len() == l.len() && d.iter().zip(l).all(|(dv, lv)| subset(dv, lv, Field::Plain))
        }
        (Value::Array(d), Value::Null) => d.is_empty(),
        (Value::String(d), Value::String(l)) => {
            d == l || (field == Field::Quantity && same_quantity(d, l))
        }
        (Value::Number(d), Value::String(l)) | (Value::String(l), Value::Number(d)) => {
            field == Field::Quantity && same_quantity(&d.to_string(), l)
        }
        (d, l) => d == l,
    }
}

fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

fn same_quantity(a: &str, b: &str) -> bool {
    use crate::desired::quantity::quantity_millis;
    quantity_millis(a).is_some_and(|a| Some(a) == quantity_millis(b))
}

#[cfg(test)]
mod tests {
    use super::is_subset;
    use serde_json::json;

    #[test]
    fn defaults_and_foreign_fields_do_not_count_as_drift() {
        let desired = json!({"spec": {"replicas": 3, "template": {"spec": {"containers": [{"name": "valkey", "image": "v"}]}}}});
        let live = json!({"spec": {"replicas": 3, "revisionHistoryLimit": 10, "template": {"spec": {"containers": [{"name": "valkey", "image": "v", "imagePullPolicy": "IfNotPresent"}]}}}});
        assert!(is_subset(&desired, &live));
    }

    #[test]
    fn a_changed_or_missing_field_is_drift() {
        let desired = json!({"spec": {"replicas": 3, "selector": {"app": "x"}}});
        assert!(!is_subset(
            &desired,
            &json!({"spec": {"replicas": 2, "selector": {"app": "x"}}})
        ));
        assert!(!is_subset(&desired, &json!({"spec": {"replicas": 3}})));
        assert!(!is_subset(&json!({"l": [1, 2]}), &json!({"l": [1, 2, 3]})));
    }

    #[test]
    fn normalized_quantities_and_empty_collections_match() {
        assert!(is_subset(
            &json!({"resources": {"requests": {"memory": "1024Mi", "cpu": "0.5"}}}),
            &json!({"resources": {"requests": {"memory": "1Gi", "cpu": "500m"}}})
        ));
        assert!(is_subset(
            &json!({"limits": {"memory": "256Mi"}, "emptyDir": {"sizeLimit": "1024Mi"}}),
            &json!({"limits": {"memory": "268435456"}, "emptyDir": {"sizeLimit": "1Gi"}})
        ));
        assert!(!is_subset(
            &json!({"requests": {"memory": "1Gi"}}),
            &json!({"requests": {"memory": "2Gi"}})
        ));
        assert!(is_subset(
            &json!({"tolerations": [], "labels": {}}),
            &json!({})
        ));
        assert!(!is_subset(
            &json!({"image": "valkey:9"}),
            &json!({"image": "valkey:10"})
        ));
    }

    #[test]
    fn quantity_rules_stay_in_quantity_fields() {
        // A nodeSelector value "1" is not the label value "1000m", nor is an image tag a size.
        assert!(!is_subset(
            &json!({"nodeSelector": {"tier": "1"}}),
            &json!({"nodeSelector": {"tier": "1000m"}})
        ));
        assert!(!is_subset(
            &json!({"annotations": {"size": "1Gi"}}),
            &json!({"annotations": {"size": "1024Mi"}})
        ));
        assert!(!is_subset(&json!({"port": "6379"}), &json!({"port": 6379})));
    }
}
