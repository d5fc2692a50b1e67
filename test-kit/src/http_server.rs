//! For the HTTP tests: an axum app served on a free loopback port, with the peer address as `ConnectInfo`.

use std::net::SocketAddr;

use axum::Router;

/// Serves `app` on `127.0.0.1:0` in a background task; returns
/// `http://127.0.0.1:port`.
pub async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .expect("serve");
    });
    format!("http://{addr}")
}
