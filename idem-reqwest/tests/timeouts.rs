//! reqwest's timeouts, before and after the request is written, and what a client can tell of
//! them: a connect timeout comes before any byte left (the key is released); a timeout of the
//! whole request reads the same whether the body was still being written or not, so it leaves
//! the key in doubt (the safe side). The timeout after the request was written is in
//! `outcomes.rs`, with the vendor's 409.

mod common;

use std::io::{ErrorKind, Read};
use std::time::Duration;

use common::{call, status, store, ToolError};
use idem::{InDoubtPolicy, Status};
use idem_reqwest::{IdempotentRequest, Landing};

/// The body's own `Err` path: the charge request, with `body` as its body.
async fn post(http: &reqwest::Client, url: &str, body: Vec<u8>) -> Result<(), ToolError> {
    http.post(url).body(body).idempotent().send().await?;
    Ok(())
}

#[tokio::test]
async fn a_connect_timeout_comes_before_the_request_and_releases_the_key() {
    // A listener that never accepts, its accept queue filled: a further connection attempt gets
    // no answer at all (Linux drops the SYN), so only the connect timeout ends it.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(0).unwrap();
    let address = listener.local_addr().unwrap();
    let mut queued = Vec::new();
    loop {
        match std::net::TcpStream::connect_timeout(&address, Duration::from_millis(200)) {
            Ok(stream) => queued.push(stream),
            Err(error) if matches!(error.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock) => {
                break
            }
            Err(error) => {
                panic!("filling the accept queue: {error} (is tcp_abort_on_overflow on?)")
            }
        }
        assert!(queued.len() < 1000, "the accept queue never filled");
    }

    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_millis(300))
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let (_dir, store) = store();
    let first = call(&store, "o-20", 4200, InDoubtPolicy::Fail);
    let key = first.key().clone();
    let url = format!("http://{address}/v1/charges");
    let timed_out = first.run_async(|| post(&http, &url, b"{}".to_vec())).await;
    let Err(ToolError::Http(error)) = timed_out else { panic!("timed out: {timed_out:?}") };
    let cause = error.failure().and_then(|f| f.cause()?.downcast_ref::<reqwest::Error>());
    assert!(cause.is_some_and(|e| e.is_connect() && e.is_timeout()), "{error}");
    assert_eq!(error.landing(), Some(Landing::NotLanded), "{error}");
    assert_eq!(status(&store, &key).await, None, "released");
    drop(listener);
}

#[test]
fn a_timeout_while_the_body_is_still_being_written_is_in_doubt_since_it_looks_the_same() {
    // A server that accepts and never reads: the client writes until the socket buffers are full
    // and its timeout strikes with most of the body unsent.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1/charges", listener.local_addr().unwrap());
    let server = std::thread::spawn(move || listener.accept().map(|(stream, _)| stream));
    const BODY: usize = 64 * 1024 * 1024;

    // The client's own runtime: dropping it closes the connection hyper keeps writing from.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (_dir, store) = store();
    runtime.block_on(async {
        let http = reqwest::Client::builder().timeout(Duration::from_millis(500)).build().unwrap();
        let first = call(&store, "o-21", 4200, InDoubtPolicy::Fail);
        let key = first.key().clone();
        let timed_out = first.run_async(|| post(&http, &url, vec![b' '; BODY])).await;
        let Err(ToolError::Http(error)) = timed_out else { panic!("timed out: {timed_out:?}") };
        let cause = error.failure().and_then(|f| f.cause()?.downcast_ref::<reqwest::Error>());
        assert!(cause.is_some_and(|e| e.is_timeout() && !e.is_connect()), "{error}");
        assert_eq!(error.landing(), Some(Landing::MayHaveLanded), "{error}");
        assert_eq!(status(&store, &key).await, Some(Status::InDoubt));
    });
    drop(runtime);

    // What reached the server, read to the end now that the client has closed.
    let mut stream = server.join().unwrap().unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut received = Vec::new();
    stream.read_to_end(&mut received).expect("the client closed the connection");
    assert!(received.len() < BODY, "most of the body never left: {} bytes", received.len());
}
