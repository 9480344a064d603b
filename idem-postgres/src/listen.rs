//! One listening connection per store, handing `NOTIFY`s to the waiters of this process.
//!
//! Every settling write (an update or a delete) is announced by its writer, with the key as
//! payload, once it has committed (`Statements::notify`; inserts need none, since nobody waits
//! for a key to appear). Waiters
//! subscribe to a key before they read it, so a change between the read and the wait is never
//! missed. When the listening connection drops, notifications sent meanwhile are lost: every
//! waiter is woken to read again, and until the connection is back waiters re-read at a bounded
//! interval instead of relying on notifications.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::store::Notifier;
use idem_runtime::StoreError;
use tokio_postgres::{AsyncMessage, NoTls};

/// The interval at which waiters re-read while the listening connection is down.
pub(crate) const DEGRADED_RECHECK: Duration = Duration::from_millis(500);

/// The waiters of this process (the runtime's one [`Notifier`], which the writes of this
/// process notify as well), and whether notifications from other processes are arriving.
#[derive(Default)]
pub(crate) struct Listener {
    pub(crate) notifier: Arc<Notifier>,
    listening: AtomicBool,
}

impl Listener {
    /// Whether notifications are arriving (false while the listening connection is down).
    pub(crate) fn listening(&self) -> bool {
        self.listening.load(Ordering::Acquire)
    }

    fn set_listening(&self, on: bool) {
        self.listening.store(on, Ordering::Release);
        // Either way a waiter must look again: notifications may have been lost in the gap.
        self.notifier.notify_all();
    }
}

/// Connects the listening connection and runs `LISTEN`; returns once it listens, with the task
/// that keeps it (and reconnects) to be spawned.
pub(crate) async fn start(
    config: tokio_postgres::Config,
    channel: String,
    listener: Arc<Listener>,
) -> Result<impl std::future::Future<Output = ()> + Send + 'static, StoreError> {
    let first = listen_once(&config, &channel, &listener).await?;
    listener.set_listening(true);
    Ok(async move {
        let mut session = first;
        // Grows while sessions die young (a server that kills the connection as soon as it is
        // made, or keeps refusing it), so that such a server is not hammered with reconnects.
        let mut backoff = Duration::ZERO;
        loop {
            let began = tokio::time::Instant::now();
            session.await;
            listener.set_listening(false);
            tracing::warn!(channel = %channel, "idem: the PostgreSQL listening connection dropped; reconnecting");
            backoff = if began.elapsed() >= STEADY { MIN_BACKOFF } else { next(backoff) };
            session = loop {
                tokio::time::sleep(backoff).await;
                match listen_once(&config, &channel, &listener).await {
                    Ok(session) => break session,
                    Err(e) => {
                        tracing::warn!(channel = %channel, error = %e, "idem: cannot reconnect the PostgreSQL listening connection");
                        backoff = next(backoff);
                    }
                }
            };
            listener.set_listening(true);
        }
    })
}

/// The first pause before reconnecting the listening connection.
const MIN_BACKOFF: Duration = Duration::from_millis(100);

/// The longest pause between reconnects.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// A session that lasted this long was healthy: the next reconnect starts with the shortest pause.
const STEADY: Duration = Duration::from_secs(10);

fn next(backoff: Duration) -> Duration {
    (backoff * 2).clamp(MIN_BACKOFF, MAX_BACKOFF)
}

/// One listening session: connects, drives the connection (delivering notifications), and
/// issues `LISTEN`. The returned future ends when the connection does.
async fn listen_once(
    config: &tokio_postgres::Config,
    channel: &str,
    listener: &Arc<Listener>,
) -> Result<impl std::future::Future<Output = ()> + Send + 'static, StoreError> {
    let (client, mut connection) = config.connect(NoTls).await.map_err(|e| {
        StoreError::with_source("cannot open the PostgreSQL listening connection", e)
    })?;
    let deliver = Arc::clone(listener);
    let driver = tokio::spawn(async move {
        loop {
            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(n))) => deliver.notifier.notify(n.payload()),
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "idem: the PostgreSQL listening connection failed");
                    return;
                }
                None => return,
            }
        }
    });
    // A listening session is idle by nature: a role's idle_session_timeout (PostgreSQL 14 and
    // later) would end it every few seconds and send it round a reconnect loop.
    let listen = format!(
        "SELECT set_config('idle_session_timeout', '0', false) FROM pg_settings \
         WHERE name = 'idle_session_timeout'; LISTEN \"{channel}\""
    );
    client.batch_execute(&listen).await.map_err(|e| {
        StoreError::with_source("cannot LISTEN on the PostgreSQL store's channel", e)
    })?;
    Ok(async move {
        // The client must live as long as the session: dropping it closes the connection.
        let _client = client;
        let _ = driver.await;
    })
}
