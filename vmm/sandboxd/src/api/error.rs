//! Failures as HTTP: a status and a JSON body `{"error": MESSAGE, "code": CODE}`.
//! `error` is a string, as seed 000's clients read it (`cocoonstack-sandbox` raises
//! `APIError(verb, status, body["error"])`); `code` is a stable name to branch on.
//! This is the one place engine errors become statuses.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use sandbox_engine::error::{
    BranchError, CaptureError, CheckpointError, CreateError, DeleteCheckpointError,
    DeleteTemplateError, ForkError, HibernateOpError, ListCheckpointsError, LookupError,
    PromoteError, RenewError,
};
use sandbox_engine::image_build::ImageBuildError;
use sandbox_engine::pool::ClaimError;
use sandbox_engine::registry::Lookup;
use sandbox_engine::sandbox::{HibernateError, Unreachable};
use sandbox_fleet::membership::FleetError;
use sandbox_fleet::store::StoreError;
use sandbox_vmm::error_chain;

use crate::store::NodeStoreError;
use sandbox_vmm::launcher::snapshot::SnapshotError;
use serde::Serialize;

/// A request that failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The status.
    pub status: StatusCode,
    /// A stable name for the failure.
    pub code: &'static str,
    /// What happened.
    pub message: String,
}

#[derive(Serialize)]
struct Body<'a> {
    error: &'a str,
    code: &'a str,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Body {
            error: &self.message,
            code: self.code,
        };
        (self.status, Json(body)).into_response()
    }
}

impl ApiError {
    /// A failure with this status, code and message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }

    /// 400: the request itself is wrong.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    /// 401: no token, or a token that is none of the node's.
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "A valid token is required: Authorization: Bearer TOKEN (the operator's, or the \
             sandbox's own from its claim)",
        )
    }

    /// 403: a sandbox token used for what only the operator may do.
    pub fn operator_only() -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "This needs the node's operator token; a sandbox token reaches its own sandbox only",
        )
    }

    /// 404: no such route.
    pub fn no_route(path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("No such endpoint: {path}"),
        )
    }

    /// 503: the node is draining.
    fn draining() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "draining",
            "The node is draining: it takes no new claims",
        )
    }

    fn internal(what: &str, error: &dyn std::error::Error) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("{what}: {}", error_chain(error)),
        )
    }
}

impl From<LookupError> for ApiError {
    fn from(error: LookupError) -> Self {
        match error.why {
            Lookup::Closed => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "shutting_down",
                error.to_string(),
            ),
            Lookup::Unknown => Self::new(StatusCode::NOT_FOUND, "not_found", error.to_string()),
            Lookup::Gone(_) => Self::new(StatusCode::GONE, "gone", error.to_string()),
        }
    }
}

/// No room, a failed boot, or shutdown.
fn pool_error<E: std::error::Error + 'static>(error: &ClaimError<E>) -> ApiError {
    match error {
        ClaimError::AtCapacity { .. } | ClaimError::Short { .. } => ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "at_capacity",
            error_chain(error),
        ),
        ClaimError::Closed => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            error_chain(error),
        ),
        ClaimError::Boot(_) => {
            ApiError::new(StatusCode::BAD_GATEWAY, "boot_failed", error_chain(error))
        }
    }
}

fn snapshot_error(error: &SnapshotError) -> ApiError {
    let (status, code) = match error {
        SnapshotError::NoCheckpoint(_) | SnapshotError::NoTemplate(_) => {
            (StatusCode::NOT_FOUND, "not_found")
        }
        SnapshotError::NotPromoted(_) => (StatusCode::CONFLICT, "conflict"),
        SnapshotError::NameTaken(_) | SnapshotError::InUse { .. } | SnapshotError::Busy { .. } => {
            (StatusCode::CONFLICT, "conflict")
        }
        SnapshotError::BadName(_) | SnapshotError::Count(_) => {
            (StatusCode::BAD_REQUEST, "bad_request")
        }
        SnapshotError::NotRunning { .. }
        | SnapshotError::NotCapable { .. }
        | SnapshotError::NotHibernated { .. }
        | SnapshotError::NoVm { .. } => (StatusCode::CONFLICT, "conflict"),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, "snapshot_failed"),
    };
    ApiError::new(status, code, error_chain(error))
}

fn unreachable(error: &Unreachable) -> ApiError {
    let (status, code) = match error {
        Unreachable::Destroyed => (StatusCode::GONE, "gone"),
        Unreachable::Attached => (StatusCode::CONFLICT, "conflict"),
        Unreachable::Wake(sandbox_engine::sandbox::WakeError::Capacity(_)) => {
            (StatusCode::TOO_MANY_REQUESTS, "at_capacity")
        }
        _ => (StatusCode::BAD_GATEWAY, "unreachable"),
    };
    ApiError::new(status, code, error_chain(error))
}

fn capture(error: &CaptureError) -> ApiError {
    match error {
        CaptureError::Unreachable(error) => unreachable(error),
        CaptureError::Snapshot(error) => snapshot_error(error),
        CaptureError::Interrupted => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            error_chain(error),
        ),
    }
}

impl From<CreateError> for ApiError {
    fn from(error: CreateError) -> Self {
        match &error {
            CreateError::Ttl(_) | CreateError::Net(_) | CreateError::Spec(_) => {
                Self::bad_request(error_chain(&error))
            }
            CreateError::Claim { error: pool, .. } => {
                let mut api = pool_error(pool);
                api.message = error_chain(&error);
                api
            }
            CreateError::Insert(inner) => Self::internal("Cannot keep the sandbox", inner),
            CreateError::AttachedTaken => {
                Self::new(StatusCode::CONFLICT, "conflict", error.to_string())
            }
            CreateError::Draining => Self::draining(),
            CreateError::Image(image) => image_build(image),
        }
    }
}

/// A claim by image reference that did not become a template: a reference that does
/// not parse is the caller's mistake (400), a registry the operator allows no builds
/// from is refused (403, the message naming the command that builds it), a failed
/// build is the registry's or the image's (502), a builder that cannot run is ours.
fn image_build(error: &ImageBuildError) -> ApiError {
    match error {
        ImageBuildError::Reference { .. } => ApiError::bad_request(error_chain(error)),
        ImageBuildError::NotAllowed { .. } => ApiError::new(
            StatusCode::FORBIDDEN,
            "registry_not_allowed",
            error_chain(error),
        ),
        ImageBuildError::Build { .. } => ApiError::new(
            StatusCode::BAD_GATEWAY,
            "image_build_failed",
            error_chain(error),
        ),
        ImageBuildError::Spawn { .. } | ImageBuildError::Output { .. } => {
            ApiError::internal("Cannot build the template", error)
        }
    }
}

impl From<RenewError> for ApiError {
    fn from(error: RenewError) -> Self {
        match error {
            RenewError::Lookup(error) => error.into(),
            RenewError::Ttl(error) => Self::bad_request(error.to_string()),
            RenewError::Attached => Self::new(StatusCode::CONFLICT, "conflict", error.to_string()),
        }
    }
}

impl From<ForkError> for ApiError {
    fn from(error: ForkError) -> Self {
        match &error {
            ForkError::NotLaunch => Self::new(StatusCode::CONFLICT, "conflict", error.to_string()),
            ForkError::Count { .. } => Self::bad_request(error.to_string()),
            ForkError::Lookup(lookup) => lookup.clone().into(),
            ForkError::NoRoom { error: pool, .. } => pool_error(pool),
            ForkError::Capture(inner) => capture(inner),
            ForkError::Children(inner) => Self::internal("The children could not be kept", inner),
        }
    }
}

impl From<CheckpointError> for ApiError {
    fn from(error: CheckpointError) -> Self {
        match &error {
            CheckpointError::NotLaunch => {
                Self::new(StatusCode::CONFLICT, "conflict", error.to_string())
            }
            CheckpointError::Name(inner) => snapshot_error(inner),
            CheckpointError::Lookup(lookup) => lookup.clone().into(),
            CheckpointError::Capture(inner) => capture(inner),
        }
    }
}

impl From<BranchError> for ApiError {
    fn from(error: BranchError) -> Self {
        match &error {
            BranchError::NotLaunch => {
                Self::new(StatusCode::CONFLICT, "conflict", error.to_string())
            }
            BranchError::EmptyKey => Self::bad_request(error.to_string()),
            BranchError::Find(inner) | BranchError::Branch(inner) => snapshot_error(inner),
            BranchError::NoRoom { error: pool, .. } => pool_error(pool.as_ref()),
            BranchError::Children(inner) => {
                Self::internal("The sandboxes could not be kept", inner)
            }
            BranchError::Draining => Self::draining(),
        }
    }
}

impl From<ListCheckpointsError> for ApiError {
    fn from(error: ListCheckpointsError) -> Self {
        match &error {
            ListCheckpointsError::NotLaunch => {
                Self::new(StatusCode::CONFLICT, "conflict", error.to_string())
            }
            ListCheckpointsError::List(inner) => snapshot_error(inner),
        }
    }
}

impl From<DeleteCheckpointError> for ApiError {
    fn from(error: DeleteCheckpointError) -> Self {
        match &error {
            DeleteCheckpointError::NotLaunch => {
                Self::new(StatusCode::CONFLICT, "conflict", error.to_string())
            }
            DeleteCheckpointError::Find(inner) | DeleteCheckpointError::Delete(inner) => {
                snapshot_error(inner)
            }
            DeleteCheckpointError::InUse { id, users } => Self::new(
                StatusCode::CONFLICT,
                "in_use",
                format!(
                    "Checkpoint {id} is in use by {}",
                    users
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ),
        }
    }
}

impl From<FleetError> for ApiError {
    fn from(error: FleetError) -> Self {
        match error {
            FleetError::Unreachable { .. } => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "etcd_unreachable",
                error.to_string(),
            ),
            FleetError::Decode(_) => Self::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "fleet_record",
                error_chain(&error),
            ),
        }
    }
}

/// The object store's failures: unreachable is a 503 `store_unreachable` (the
/// operations that need the store fail; local claims and execs go on); a blob that
/// fails its digest a 502 `store_digest_mismatch`; a checkpoint of another QEMU or
/// machine a 409 `checkpoint_incompatible`.
impl From<NodeStoreError> for ApiError {
    fn from(error: NodeStoreError) -> Self {
        let message = error_chain(&error);
        if let NodeStoreError::Record { error: fleet, .. } | NodeStoreError::Fleet(fleet) = &error {
            return match fleet {
                FleetError::Unreachable { .. } => {
                    Self::new(StatusCode::SERVICE_UNAVAILABLE, "etcd_unreachable", message)
                }
                FleetError::Decode(_) => {
                    Self::new(StatusCode::INTERNAL_SERVER_ERROR, "fleet_record", message)
                }
            };
        }
        let (status, code) = match error.store_error() {
            Some(StoreError::Unreachable { .. }) => {
                (StatusCode::SERVICE_UNAVAILABLE, "store_unreachable")
            }
            Some(StoreError::NotFound { .. }) => (StatusCode::NOT_FOUND, "not_found"),
            Some(StoreError::Tampered { .. }) => (StatusCode::BAD_GATEWAY, "store_digest_mismatch"),
            Some(StoreError::Manifest { .. }) => {
                (StatusCode::BAD_GATEWAY, "store_manifest_invalid")
            }
            Some(StoreError::Incompatible { .. }) => {
                (StatusCode::CONFLICT, "checkpoint_incompatible")
            }
            Some(StoreError::Config { .. } | StoreError::Local { .. }) | None => {
                (StatusCode::INTERNAL_SERVER_ERROR, "internal")
            }
        };
        Self::new(status, code, message)
    }
}

impl From<HibernateOpError> for ApiError {
    fn from(error: HibernateOpError) -> Self {
        match error {
            HibernateOpError::Lookup(error) => error.into(),
            HibernateOpError::Hibernate(error) => {
                let (status, code) = match &error {
                    HibernateError::NotCapable(_) => (StatusCode::CONFLICT, "conflict"),
                    HibernateError::Destroyed => (StatusCode::GONE, "gone"),
                    HibernateError::Capture { .. } => {
                        (StatusCode::INTERNAL_SERVER_ERROR, "snapshot_failed")
                    }
                };
                Self::new(status, code, error_chain(&error))
            }
        }
    }
}

impl From<DeleteTemplateError> for ApiError {
    fn from(error: DeleteTemplateError) -> Self {
        match &error {
            DeleteTemplateError::NotLaunch
            | DeleteTemplateError::Default(_)
            | DeleteTemplateError::InUse { .. } => {
                Self::new(StatusCode::CONFLICT, "conflict", error.to_string())
            }
            DeleteTemplateError::Snapshot(inner) => snapshot_error(inner),
        }
    }
}

impl From<PromoteError> for ApiError {
    fn from(error: PromoteError) -> Self {
        match &error {
            PromoteError::NotLaunch | PromoteError::Default(_) | PromoteError::Built(_) => {
                Self::new(StatusCode::CONFLICT, "conflict", error.to_string())
            }
            PromoteError::Name(inner) => snapshot_error(inner),
            PromoteError::Lookup(lookup) => lookup.clone().into(),
            PromoteError::Capture(inner) => capture(inner),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_are_404_or_410_and_capacity_is_429() {
        let unknown = ApiError::from(LookupError {
            id: "sbx-x".into(),
            why: Lookup::Unknown,
            live: vec![],
        });
        assert_eq!(unknown.status, StatusCode::NOT_FOUND);
        let gone = ApiError::from(LookupError {
            id: "sbx-x".into(),
            why: Lookup::Gone(sandbox_engine::registry::Gone::Released),
            live: vec![],
        });
        assert_eq!(gone.status, StatusCode::GONE);
        let full: ClaimError<std::io::Error> = ClaimError::AtCapacity { max: 2 };
        assert_eq!(pool_error(&full).status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            ApiError::from(CreateError::Draining).status,
            StatusCode::SERVICE_UNAVAILABLE
        );
    }
}
