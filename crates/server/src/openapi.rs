//! The OpenAPI 3.1 document, generated from the handlers' annotations (`utoipa`) and served at
//! `/api/openapi.json` without a token.

use std::sync::Arc;

use axum::Json;
use utoipa::OpenApi;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Tidegate",
        description = "Partitioned data pipelines where every run is a data release. Every route except \
                       /healthz, /readyz and this document needs `Authorization: Bearer TOKEN` (`tidegate token \
                       create`); errors are RFC 9457 problems (application/problem+json) with a stable `code`. \
                       Every POST that changes state takes an `Idempotency-Key` header \
                       (draft-ietf-httpapi-idempotency-key-header); those whose effect a retry would repeat \
                       (submitting a run, planning a backfill, rolling a dataset back) require it. A retry with the \
                       same key and request gets the first response again, marked `Idempotent-Replayed: true`. A run, \
                       backfill or release id in a path may be a unique prefix of it (4 characters or more), as git \
                       takes a commit's."
    ),
    components(schemas(crate::problem::Problem)),
    modifiers(&Bearer),
    security(("bearer" = []))
)]
struct Base;

struct Bearer;

impl utoipa::Modify for Bearer {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).bearer_format("tgt_...").build()),
        );
    }
}

/// The document's base: its info, the bearer scheme every route requires, the problem schema.
pub(crate) fn base() -> utoipa::openapi::OpenApi {
    Base::openapi()
}

/// The whole document, as the server serves it.
pub fn document() -> utoipa::openapi::OpenApi {
    crate::routes::api().split_for_parts().1
}

pub(crate) async fn serve(api: Arc<utoipa::openapi::OpenApi>) -> Json<serde_json::Value> {
    Json(serde_json::to_value(api.as_ref()).unwrap_or_default())
}
