//! The NodeSLO's `spec.hostApplications`: processes outside Kubernetes that koordlet's plugins
//! treat like pods of a QoS class (koordinator `apis/slo/v1alpha1/host_application.go`, the
//! cgroup directory from `pkg/koordlet/util/host_application.go`, v1.8.0).
//!
//! | field | meaning |
//! |---|---|
//! | `name` | the application; its directory's last component when no `cgroupPath` is given |
//! | `qos` | `LSE`, `LSR`, `LS`, `BE` (or `SYSTEM`, or empty: none) |
//! | `cgroupPath.base` | `CgroupRoot` (default), `Kubepods`, `KubepodsBurstable`, `KubepodsBesteffort` |
//! | `cgroupPath.parentDir`, `cgroupPath.relativePath` | joined below the base |
//!
//! Without `cgroupPath` the directory is `host-latency-sensitive/<name>` for LSE/LSR/LS,
//! `host-best-effort/<name>` for BE and `<name>` otherwise, below the cgroup root. The
//! operator's own processes are expected to run there; the plugins only set values.

use serde::Serialize;
use serde_json::Value;

use super::field::FieldError;
use crate::context::QosClass;

/// Where a host application's directory starts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum HostAppBase {
    /// The cgroup root (`/sys/fs/cgroup/<controller>` on v1).
    #[default]
    CgroupRoot,
    /// kubelet's pods root (`kubepods`, the Guaranteed QoS directory).
    Kubepods,
    /// `kubepods/burstable`.
    KubepodsBurstable,
    /// `kubepods/besteffort`.
    KubepodsBesteffort,
}

/// One host application.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HostApplication {
    /// Its name.
    pub name: String,
    /// Its QoS class.
    #[serde(serialize_with = "qos_name")]
    pub qos: QosClass,
    /// Where its directory starts.
    pub base: HostAppBase,
    /// Its directory below the base (`a/b`, no leading `/`, no `..`).
    pub path: String,
}

fn qos_name<S: serde::Serializer>(q: &QosClass, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(q.as_str())
}

/// Parses `spec.hostApplications` (absent or `null`: none).
///
/// Errors: not a list of objects, a field of the wrong type, an unknown base, a path component
/// `..` (the directory must stay below its base), an empty name without a `cgroupPath`.
pub fn parse(spec: &Value) -> Result<Vec<HostApplication>, FieldError> {
    let list = match spec.get("hostApplications") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(list)) => list,
        Some(other) => return Err(FieldError::new("spec.hostApplications", format!("{other} is not a list"))),
    };
    list.iter().enumerate().map(|(i, app)| parse_one(app, &format!("spec.hostApplications[{i}]"))).collect()
}

fn string(v: Option<&Value>, field: &str) -> Result<String, FieldError> {
    match v {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(FieldError::new(field, format!("{other} is not a string"))),
    }
}

fn parse_one(app: &Value, at: &str) -> Result<HostApplication, FieldError> {
    if !app.is_object() {
        return Err(FieldError::new(at, format!("{app} is not an object")));
    }
    let name = string(app.get("name"), &format!("{at}.name"))?;
    let qos_text = string(app.get("qos"), &format!("{at}.qos"))?;
    let qos = QosClass::from_name(&qos_text);
    let (base, parts) = match app.get("cgroupPath") {
        None | Some(Value::Null) => {
            if name.is_empty() {
                return Err(FieldError::new(format!("{at}.name"), "empty, and no cgroupPath to place the application"));
            }
            let dir = match qos {
                QosClass::Lse | QosClass::Lsr | QosClass::Ls => "host-latency-sensitive",
                QosClass::Be => "host-best-effort",
                _ => "",
            };
            (HostAppBase::CgroupRoot, vec![(dir.to_owned(), format!("{at}.qos")), (name.clone(), format!("{at}.name"))])
        }
        Some(p) => {
            let f = |k: &str| format!("{at}.cgroupPath.{k}");
            let base = match string(p.get("base"), &f("base"))?.as_str() {
                "" | "CgroupRoot" => HostAppBase::CgroupRoot,
                "Kubepods" => HostAppBase::Kubepods,
                "KubepodsBurstable" => HostAppBase::KubepodsBurstable,
                "KubepodsBesteffort" => HostAppBase::KubepodsBesteffort,
                other => {
                    return Err(FieldError::new(
                        f("base"),
                        format!(
                            "unknown value {other:?} (CgroupRoot, Kubepods, KubepodsBurstable or KubepodsBesteffort)"
                        ),
                    ))
                }
            };
            let parent = string(p.get("parentDir"), &f("parentDir"))?;
            let relative = string(p.get("relativePath"), &f("relativePath"))?;
            (base, vec![(parent, f("parentDir")), (relative, f("relativePath"))])
        }
    };
    let mut components = Vec::new();
    for (text, field) in &parts {
        for c in text.split('/').filter(|c| !c.is_empty() && *c != ".") {
            if c == ".." {
                return Err(FieldError::new(field.clone(), format!("{text:?} leaves its base directory")));
            }
            components.push(c);
        }
    }
    Ok(HostApplication { name, qos, base, path: components.join("/") })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn directories_as_koordlet_places_them() {
        let spec = json!({"hostApplications": [
            {"name": "nginx", "qos": "LS"},
            {"name": "batch", "qos": "BE"},
            {"name": "other"},
            {"name": "x", "qos": "LS", "cgroupPath": {"base": "KubepodsBesteffort", "parentDir": "/host/", "relativePath": "x"}},
        ]});
        let apps = parse(&spec).unwrap();
        let got: Vec<(QosClass, HostAppBase, &str)> = apps.iter().map(|a| (a.qos, a.base, a.path.as_str())).collect();
        assert_eq!(
            got,
            [
                (QosClass::Ls, HostAppBase::CgroupRoot, "host-latency-sensitive/nginx"),
                (QosClass::Be, HostAppBase::CgroupRoot, "host-best-effort/batch"),
                (QosClass::None, HostAppBase::CgroupRoot, "other"),
                (QosClass::Ls, HostAppBase::KubepodsBesteffort, "host/x"),
            ]
        );
        assert!(parse(&json!({})).unwrap().is_empty());
    }

    #[test]
    fn bad_entries_name_the_field() {
        let e = parse(&json!({"hostApplications": [{"name": "a", "cgroupPath": {"base": "Nope"}}]})).unwrap_err();
        assert_eq!(e.field, "spec.hostApplications[0].cgroupPath.base");
        let e = parse(&json!({"hostApplications": [{"name": "a"}, {"name": "../../etc", "qos": "LS"}]})).unwrap_err();
        assert_eq!(e.field, "spec.hostApplications[1].name");
        let e = parse(&json!({"hostApplications": [{"name": "a", "cgroupPath": {"relativePath": "a/../../b"}}]}))
            .unwrap_err();
        assert!(e.field.ends_with("relativePath"), "{e}");
        assert_eq!(parse(&json!({"hostApplications": 3})).unwrap_err().field, "spec.hostApplications");
        assert_eq!(
            parse(&json!({"hostApplications": [{"qos": "LS"}]})).unwrap_err().field,
            "spec.hostApplications[0].name"
        );
    }
}
