//! A request body as a JSON object, or the 400/413 that says why not. Its fields are then read
//! by the rules every face shares (`crate::api`). Called by the handlers in `routes` and
//! `router_api`.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use serde_json::{Map, Value};

use super::error::ApiError;
use crate::api::request::{json_too_deep, too_deep_message, type_name};

/// The body as a JSON object, or the 400/413 that says why not.
pub fn json_object(
    body: Result<Bytes, BytesRejection>,
    max_body_bytes: usize,
) -> Result<Map<String, Value>, ApiError> {
    let bytes = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                format!(
                    "the request body is larger than {max_body_bytes} bytes (--max-body-bytes)"
                ),
            )
            .with_code("body_too_large")
        } else {
            ApiError::new(e.status(), "invalid_request_error", e.body_text())
        }
    })?;
    let value: Value = serde_json::from_slice(&bytes).map_err(|e| {
        if json_too_deep(&e) {
            ApiError::bad_request(too_deep_message("the request body", &e))
                .with_code("json_too_deep")
        } else {
            ApiError::bad_request(format!("the request body is not valid JSON: {e}"))
                .with_code("invalid_json")
        }
    })?;
    match value {
        Value::Object(map) => Ok(map),
        other => Err(ApiError::bad_request(format!(
            "the request body must be a JSON object, not {}",
            type_name(&other)
        ))),
    }
}
