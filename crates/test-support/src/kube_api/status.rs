//! `meta.k8s.io/v1` Status bodies, field for field and in kube-apiserver's key order, so that a
//! pretty-printed one is byte for byte the recorded answer (07, 09–13).

use serde::Serialize;

use super::resources::Resource;

/// A Status as kube-apiserver encodes it (`metav1.Status`; empty fields left out as Go's
/// `omitempty` does, `metadata` always `{}`).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub(crate) struct Status {
    kind: &'static str,
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    metadata: Empty,
    status: &'static str,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(skip_serializing_if = "str::is_empty")]
    pub reason: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    details: Option<Box<Details>>,
    /// The HTTP status; left out of a success (07).
    #[serde(skip_serializing_if = "is_zero")]
    pub code: u16,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
struct Empty {}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
struct Details {
    #[serde(skip_serializing_if = "String::is_empty")]
    name: String,
    #[serde(skip_serializing_if = "str::is_empty")]
    group: &'static str,
    #[serde(skip_serializing_if = "String::is_empty")]
    kind: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    uid: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    causes: Vec<Cause>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
struct Cause {
    reason: &'static str,
    message: String,
    field: &'static str,
}

fn is_zero(code: &u16) -> bool {
    *code == 0
}

impl Status {
    fn failure(code: u16, reason: &'static str, message: String, details: Option<Details>) -> Status {
        let details = details.map(Box::new);
        Status {
            kind: "Status",
            api_version: "v1",
            metadata: Empty {},
            status: "Failure",
            message,
            reason,
            details,
            code,
        }
    }

    /// Details naming one object (`kind` is the plural, as kube-apiserver fills it).
    fn about(resource: &Resource, name: &str) -> Option<Details> {
        Some(Details {
            name: name.to_owned(),
            group: resource.group,
            kind: resource.plural.to_owned(),
            ..Details::default()
        })
    }

    /// 200 Success after a DELETE (07-delete-nodeslo.txt): no message, reason or code.
    pub fn deleted(resource: &Resource, name: &str, uid: &str) -> Status {
        let details = Details { uid: uid.to_owned(), ..Status::about(resource, name).unwrap() };
        Status { status: "Success", code: 0, ..Status::failure(0, "", String::new(), Some(details)) }
    }

    /// 401 for a missing or unknown bearer token (12-list-nodeslo-unauthorized.txt).
    pub fn unauthorized() -> Status {
        Status::failure(401, "Unauthorized", "Unauthorized".into(), None)
    }

    /// 403 for a user without the right (11-list-nodeslo-forbidden.txt): the message names the
    /// user, the verb, the resource, its group and the scope; `name` is the object, or the
    /// `metadata.name` a list/watch selects on, or empty.
    pub fn forbidden(user: &str, verb: &str, resource: &Resource, namespace: Option<&str>, name: &str) -> Status {
        let scope = match namespace {
            Some(ns) => format!("in the namespace {ns:?}"),
            None => "at the cluster scope".to_owned(),
        };
        let why = format!(
            "User {user:?} cannot {verb} resource {:?} in API group {:?} {scope}",
            resource.plural, resource.group
        );
        let message = match name {
            "" => format!("{} is forbidden: {why}", resource.group_resource()),
            _ => format!("{} {name:?} is forbidden: {why}", resource.group_resource()),
        };
        Status::failure(403, "Forbidden", message, Status::about(resource, name))
    }

    /// 404 for an object that does not exist (13-get-nodeslo-notfound.txt).
    pub fn not_found(resource: &Resource, name: &str) -> Status {
        let message = format!("{} {name:?} not found", resource.group_resource());
        Status::failure(404, "NotFound", message, Status::about(resource, name))
    }

    /// 409 for a create of a name that exists (not recorded; kube-apiserver's wording).
    pub fn already_exists(resource: &Resource, name: &str) -> Status {
        let message = format!("{} {name:?} already exists", resource.group_resource());
        Status::failure(409, "AlreadyExists", message, Status::about(resource, name))
    }

    /// 409 for a write whose `metadata.resourceVersion` is not the stored one (not recorded;
    /// kube-apiserver's wording).
    pub fn conflict(resource: &Resource, name: &str) -> Status {
        let message = format!(
            "Operation cannot be fulfilled on {} {name:?}: the object has been modified; please apply your changes to the latest version and try again",
            resource.group_resource()
        );
        Status::failure(409, "Conflict", message, Status::about(resource, name))
    }

    /// 400 (a bad field selector, a body of the wrong kind or namespace, …).
    pub fn bad_request(message: String) -> Status {
        Status::failure(400, "BadRequest", message, None)
    }

    /// 405 for a method a path does not take (not recorded; kube-apiserver's wording).
    pub fn method_not_allowed() -> Status {
        Status::failure(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource".into(),
            None,
        )
    }

    /// 415 for a PATCH in a format other than `application/merge-patch+json`.
    pub fn unsupported_patch(content_type: &str) -> Status {
        let message = format!(
            "the body of the request was in an unknown format - accepted media types include: application/merge-patch+json (got {content_type:?})"
        );
        Status::failure(415, "UnsupportedMediaType", message, None)
    }

    /// 422 for `sendInitialEvents` (09-watch-streaming-list.txt: the WatchList feature gate is off
    /// by default in 1.31); `watch` says which of the two messages applies.
    pub fn send_initial_events_forbidden(watch: bool) -> Status {
        let what = match watch {
            true => "Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled",
            false => "Forbidden: sendInitialEvents is forbidden for list",
        };
        let details = Details {
            group: "meta.k8s.io",
            kind: "ListOptions".into(),
            causes: vec![Cause { reason: "FieldValueForbidden", message: what.into(), field: "sendInitialEvents" }],
            ..Details::default()
        };
        let message = format!("ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: {what}");
        Status::failure(422, "Invalid", message, Some(details))
    }

    /// 422 for a create with neither `metadata.name` nor `metadata.generateName`.
    pub fn name_required(resource: &Resource) -> Status {
        let what = "Required value: name or generateName is required";
        let details = Details {
            group: resource.group,
            kind: resource.kind.into(),
            causes: vec![Cause { reason: "FieldValueRequired", message: what.into(), field: "metadata.name" }],
            ..Details::default()
        };
        Status::failure(
            422,
            "Invalid",
            format!("{} \"\" is invalid: metadata.name: {what}", resource.kind),
            Some(details),
        )
    }

    /// The `ERROR` event's object for a watch from a compacted resourceVersion
    /// (10-watch-too-old.txt); HTTP 410 for a list `continue` token that old.
    pub fn expired(requested: u64, oldest: u64) -> Status {
        Status::failure(410, "Expired", format!("too old resource version: {requested} ({oldest})"), None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_as_recorded() {
        let json = serde_json::to_string(&Status::expired(1, 208)).unwrap();
        assert_eq!(
            json,
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 1 (208)","reason":"Expired","code":410}"#
        );
        let deleted = serde_json::to_string(&Status::deleted(Resource::by_plural("nodeslos"), "node-a", "u")).unwrap();
        assert_eq!(
            deleted,
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Success","details":{"name":"node-a","group":"slo.koordinator.sh","kind":"nodeslos","uid":"u"}}"#
        );
        let forbidden = Status::forbidden("limited", "list", Resource::by_plural("pods"), Some("default"), "");
        assert_eq!(
            forbidden.message,
            r#"pods is forbidden: User "limited" cannot list resource "pods" in API group "" in the namespace "default""#
        );
    }
}
