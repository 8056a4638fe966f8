//! OpenAI-style errors: every failure a client can cause or meet becomes an [`ApiError`],
//! answered as `{"error": {"message", "type", "param", "code"}}` with its HTTP status.
//! Used by every handler and by the middleware (auth, unknown routes, body limits).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::api::{FieldError, RequestError};
use crate::engine::SubmitError;

#[derive(Clone, Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's error type: `invalid_request_error`, `authentication_error`, ...
    pub kind: &'static str,
    /// The request field at fault, if one is.
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds a client should wait before trying again (`Retry-After`), where the refusal
    /// is the server being busy.
    pub retry_after_secs: Option<u32>,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after_secs: None,
        }
    }

    /// A 400 about one request field.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        ApiError {
            param: Some(param.to_string()),
            ..ApiError::bad_request(message)
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    pub fn with_retry_after(mut self, secs: u32) -> Self {
        self.retry_after_secs = Some(secs);
        self
    }

    /// The error as the JSON object OpenAI clients parse.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }

    /// Why the engine refused a request; `param` names the field that carried the prompt.
    pub fn from_submit(e: SubmitError, param: &str) -> Self {
        if let Some(refused) = RequestError::from_submit(&e, param) {
            return refused.into();
        }
        match e {
            SubmitError::QueueFull(queued) => ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                format!("the server is busy: {queued} requests are already queued or running (--max-queue); retry later"),
            )
            .with_code("queue_full")
            .with_retry_after(1),
            _ => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", "the engine has stopped")
                .with_code("engine_stopped"),
        }
    }
}

/// A request the shared rules refused (`crate::api`): a 400 naming the field.
impl From<RequestError> for ApiError {
    fn from(e: RequestError) -> Self {
        ApiError {
            param: e.param,
            code: e.code,
            ..ApiError::bad_request(e.message)
        }
    }
}

impl From<FieldError> for ApiError {
    fn from(e: FieldError) -> Self {
        ApiError::invalid(&e.param, e.message)
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status.as_u16(), self.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if let Some(secs) = self.retry_after_secs {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        // The middleware logs the message with the request's line; the Messages routes answer
        // the error in Anthropic's shape instead (`messages::anthropic_errors`).
        response
            .extensions_mut()
            .insert(super::middleware::LogNote(self.message.clone()));
        response.extensions_mut().insert(self);
        response
    }
}
