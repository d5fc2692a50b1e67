//! The gRPC face: `envoy.service.ratelimit.v3.RateLimitService` over the
//! [`Engine`].

use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::{Request, Response, Status};

use crate::engine::Engine;

/// `RateLimitService` on an engine.
#[derive(Clone, Debug)]
pub struct RateLimitGrpc {
    engine: Arc<Engine>,
}

impl RateLimitGrpc {
    /// The service for `engine`, ready for tonic's router.
    pub fn server(engine: Arc<Engine>) -> RateLimitServiceServer<RateLimitGrpc> {
        RateLimitServiceServer::new(RateLimitGrpc { engine })
    }
}

#[tonic::async_trait]
impl RateLimitService for RateLimitGrpc {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        self.engine
            .should_rate_limit(request.get_ref())
            .await
            .map(Response::new)
            .map_err(|e| Status::invalid_argument(e.to_string()))
    }
}
