//! One listening connection per store, handing `NOTIFY`s to the waiters of this process, and
//! the probe that tells whether notifications really arrive on it.
//!
//! Every settling write (an update or a delete) is announced by its writer, with the key as
//! payload, once it has committed (`Statements::notify`; inserts need none, since nobody waits
//! for a key to appear). Waiters subscribe to a key before they read it, so a change between
//! the read and the wait is never missed.
//!
//! A listening connection can be up and still hear nothing: through a pooler in transaction
//! mode, `LISTEN` runs on a server connection that goes back to the pool at once, and the
//! notifications it then receives reach no one (or another client of the pooler). So the store
//! does not take `LISTEN` succeeding as proof. It sends a notification of its own, through its
//! pool as any writer would, on a channel only this store instance listens on, at start-up and
//! every [`PROBE_EVERY`]; notifications are trusted only while that probe comes back. Until it
//! has, and whenever it stops, waiters re-read every [`UNHEARD_RECHECK`] instead. A session that
//! had heard its probe and then misses one is replaced at once (a connection that went silent);
//! one that never heard it (a pooler, most likely, where a new one would not hear either)
//! `UNLISTEN`s and is closed, and a new one is tried after [`UNHEARD_RETRY`].

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::store::Notifier;
use idem_runtime::StoreError;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_postgres::{AsyncMessage, Client, NoTls};

/// The interval at which waiters re-read while notifications are not known to arrive: the
/// listening connection is down, its probe has not come back yet, or it never will (a pooler
/// in transaction mode). It bounds how late such a waiter learns of a change.
pub(crate) const UNHEARD_RECHECK: Duration = Duration::from_millis(50);

/// How often the listening connection's probe goes out.
const PROBE_EVERY: Duration = Duration::from_secs(10);

/// How long a probe may take to come back before notifications count as not arriving.
const PROBE_WAIT: Duration = Duration::from_secs(2);

/// The channels the listening connection listens on.
#[derive(Clone, Debug)]
pub(crate) struct Channels {
    /// The table's channel: every change, with the key as payload.
    pub(crate) table: String,
    /// This store instance's own: its probes, numbered.
    pub(crate) probe: String,
}

/// The waiters of this process (the runtime's one [`Notifier`], which the writes of this
/// process notify as well), and whether notifications from other processes are arriving.
pub(crate) struct Listener {
    pub(crate) notifier: Arc<Notifier>,
    listening: AtomicBool,
    /// Whether the store's pool may keep named statements (`Listener::sessions`).
    sessions: AtomicBool,
    /// The number of the last probe heard.
    heard: watch::Sender<u64>,
}

impl Default for Listener {
    fn default() -> Listener {
        Listener {
            notifier: Arc::default(),
            listening: AtomicBool::new(false),
            sessions: AtomicBool::new(false),
            heard: watch::channel(0).0,
        }
    }
}

impl Channels {
    /// The table's channel, and a probe channel of `instance`'s own (a hash of it, within
    /// PostgreSQL's 63 bytes), so that no other process hears this store's probes.
    pub(crate) fn new(table: String, instance: &str) -> Channels {
        use sha2::{Digest, Sha256};
        let digest = Sha256::digest(instance);
        let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
        Channels { probe: format!("{table}_{hex}"), table }
    }
}

impl Listener {
    /// Whether notifications are arriving: the listening connection is up and its last probe
    /// came back.
    pub(crate) fn listening(&self) -> bool {
        self.listening.load(Ordering::Acquire)
    }

    /// Whether the store's URL is known to give sessions of their own, where named statements
    /// are safe: the listening connection, opened with that URL, heard its own probe. A pooler
    /// in transaction mode never delivers it (the `LISTEN` stays on a server connection that is
    /// no longer this client's), nor in statement mode; a direct connection and a session-mode
    /// pooler do. False with a `listen_url` of its own, whose probe says nothing of the pool's.
    pub(crate) fn sessions(&self) -> bool {
        self.sessions.load(Ordering::Acquire)
    }

    fn set_listening(&self, on: bool) {
        if self.listening.swap(on, Ordering::AcqRel) != on {
            // Either way a waiter must look again: notifications may have been lost in the gap,
            // and a waiter that slept for a notification must now re-read at the short interval.
            self.notifier.notify_all();
        }
    }

    fn deliver(&self, channel: &str, probes: &str, payload: &str) {
        if channel != probes {
            self.notifier.notify(payload);
        } else if let Ok(n) = payload.parse::<u64>() {
            self.heard.send_modify(|heard| *heard = (*heard).max(n));
        }
    }
}

/// Connects the listening connection and runs `LISTEN`; returns once it listens, with the task
/// that keeps it (probing it, and reconnecting) to be spawned. `probe(n)` sends probe `n` on
/// the probe channel through the store's pool. `pool_url` says whether `config` is the pool's
/// own URL (no `listen_url`).
pub(crate) async fn start<P, F>(
    config: tokio_postgres::Config,
    pool_url: bool,
    channels: Channels,
    listener: Arc<Listener>,
    probe: P,
) -> Result<impl Future<Output = ()> + Send + 'static, StoreError>
where
    P: Fn(u64) -> F + Send + Sync + 'static,
    F: Future<Output = Result<(), StoreError>> + Send,
{
    let first = Session::open(&config, &channels, &listener).await?;
    Ok(async move {
        let mut session = first;
        let mut probes = 0;
        // Grows while sessions die young (a server that kills the connection as soon as it is
        // made, or keeps refusing it), so that such a server is not hammered with reconnects.
        let mut backoff = Duration::ZERO;
        let mut told = false;
        loop {
            let began = tokio::time::Instant::now();
            let silence = tokio::select! {
                _ = &mut session.driver => Silence::Ended,
                silence = probe_session(&session.client, &listener, &probe, &mut probes, pool_url) => silence,
            };
            listener.sessions.store(false, Ordering::Release);
            listener.set_listening(false);
            let pause = match silence {
                Silence::Never => {
                    // Through a pooler in transaction mode the `LISTEN` stays on a server
                    // connection of the pool, where no one hears it: take it off, as far as the
                    // pooler lets this reach it, and look again much later.
                    let _ = session.client.batch_execute("UNLISTEN *").await;
                    if !std::mem::replace(&mut told, true) {
                        tracing::info!(channel = %channels.table, "idem: notifications do not arrive on the PostgreSQL listening connection (a pooler in transaction mode?); waiters re-read every {} ms. Give the store a direct or session-mode listen_url to wake them at once", UNHEARD_RECHECK.as_millis());
                    }
                    UNHEARD_RETRY
                }
                Silence::Stopped | Silence::Ended | Silence::Unsent => {
                    tracing::warn!(channel = %channels.table, "idem: the PostgreSQL listening connection dropped or went silent; reconnecting");
                    backoff = if began.elapsed() >= STEADY { MIN_BACKOFF } else { next(backoff) };
                    backoff
                }
            };
            drop(session);
            tokio::time::sleep(pause).await;
            session = loop {
                match Session::open(&config, &channels, &listener).await {
                    Ok(session) => break session,
                    Err(e) => {
                        tracing::warn!(channel = %channels.table, error = %e, "idem: cannot reconnect the PostgreSQL listening connection");
                        backoff = next(backoff);
                        tokio::time::sleep(backoff).await;
                    }
                }
            };
        }
    })
}

/// Why a listening session is given up.
enum Silence {
    /// Its connection ended.
    Ended,
    /// Its first probe never came back: notifications do not arrive on it.
    Never,
    /// It had heard its probe, then missed one: the connection went silent.
    Stopped,
    /// A probe could not be sent (the pool reached no server): nothing is known of the session,
    /// which is replaced as a dropped one is.
    Unsent,
}

/// How long the store goes without a listening connection once notifications were found not
/// to arrive on one, before it tries a new one.
const UNHEARD_RETRY: Duration = Duration::from_secs(60);

/// The first pause before reconnecting the listening connection.
const MIN_BACKOFF: Duration = Duration::from_millis(100);

/// The longest pause between reconnects.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// A session that lasted this long was healthy: the next reconnect starts with the shortest pause.
const STEADY: Duration = Duration::from_secs(10);

fn next(backoff: Duration) -> Duration {
    (backoff * 2).clamp(MIN_BACKOFF, MAX_BACKOFF)
}

/// One listening session: its client (dropping it closes the connection) and the task that
/// drives the connection, delivering notifications, which ends when the connection does.
struct Session {
    client: Client,
    driver: JoinHandle<()>,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

impl Session {
    /// Connects, starts delivering notifications, and issues `LISTEN` on both channels.
    async fn open(
        config: &tokio_postgres::Config,
        channels: &Channels,
        listener: &Arc<Listener>,
    ) -> Result<Session, StoreError> {
        let (client, mut connection) = config.connect(NoTls).await.map_err(|e| {
            StoreError::with_source("cannot open the PostgreSQL listening connection", e)
        })?;
        let (deliver, probes) = (Arc::clone(listener), channels.probe.clone());
        let driver = tokio::spawn(async move {
            loop {
                match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                    Some(Ok(AsyncMessage::Notification(n))) => {
                        deliver.deliver(n.channel(), &probes, n.payload())
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "idem: the PostgreSQL listening connection failed");
                        return;
                    }
                    None => return,
                }
            }
        });
        let session = Session { client, driver };
        let listen = format!("LISTEN \"{}\"; LISTEN \"{}\"", channels.table, channels.probe);
        session.client.batch_execute(&listen).await.map_err(|e| {
            StoreError::with_source("cannot LISTEN on the PostgreSQL store's channel", e)
        })?;
        Ok(session)
    }
}

/// Probes the session every [`PROBE_EVERY`], setting whether notifications arrive; returns
/// once a probe does not come back.
async fn probe_session<P, F>(
    client: &Client,
    listener: &Listener,
    probe: &P,
    sent: &mut u64,
    pool_url: bool,
) -> Silence
where
    P: Fn(u64) -> F,
    F: Future<Output = Result<(), StoreError>>,
{
    let mut heard_once = false;
    loop {
        *sent += 1;
        let n = *sent;
        let mut heard = listener.heard.subscribe();
        let back = tokio::time::timeout(PROBE_WAIT, async {
            if let Err(e) = probe(n).await {
                tracing::debug!(error = %e, "idem: cannot send the listening connection's probe");
                return Err(Silence::Unsent);
            }
            // The sender lives in the listener, as long as this task.
            let _ = heard.wait_for(|h| *h >= n).await;
            Ok(())
        })
        .await;
        let arrived = match back {
            Ok(Ok(())) => true,
            Ok(Err(unsent)) => return unsent,
            Err(_) => false,
        };
        match (arrived, heard_once) {
            (false, false) => return Silence::Never,
            (false, true) => return Silence::Stopped,
            (true, true) => {}
            (true, false) => {
                heard_once = true;
                keep_alive(client).await;
                listener.sessions.store(pool_url, Ordering::Release);
            }
        }
        listener.set_listening(true);
        tokio::time::sleep(PROBE_EVERY).await;
    }
}

/// A listening session is idle by nature: a role's idle_session_timeout (PostgreSQL 14 and
/// later) would end it every few seconds and send it round a reconnect loop. Set only once
/// its probe came back, which proves it is a session of its own: through a pooler in
/// transaction mode the setting would stay on a server connection other clients share.
async fn keep_alive(client: &Client) {
    let untimed = "SELECT set_config('idle_session_timeout', '0', false) FROM pg_settings \
                   WHERE name = 'idle_session_timeout'";
    if let Err(e) = client.batch_execute(untimed).await {
        tracing::debug!(error = %e, "idem: cannot turn off idle_session_timeout on the listening connection");
    }
}
