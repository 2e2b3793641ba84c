//! The main thread's side: [`RemoteSink`], the request/reply protocol with the sink thread,
//! timeouts, abandoning a request, and the interruptible wait for a reply.

use super::*;
use crate::target::wait::Waited;

/// What a request asks the sink thread to do.
pub(super) enum Work {
    /// Steps to run in one transaction, then commit; or, with a [`Part`], one part of a
    /// transaction that spans several requests.
    Transaction(Vec<RemoteStep>, Option<Part>),
    /// One statement outside an explicit transaction.
    Query(RemoteStatement),
}

/// One part of a remote transaction sent in several requests ([`RemoteSink::transaction_part`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Part {
    /// Names the transaction (chosen by the caller, unique per [`RemoteSink`]).
    pub id: u64,
    /// An earlier part with this `id` began the transaction: run the steps in it, and fail if
    /// the connection no longer has it open (it was lost with the connection).
    pub continues: bool,
    /// Commit after the steps; else leave the transaction open for the next part.
    pub commit: bool,
}

/// A request to the sink thread.
pub(super) struct Request {
    /// Sequence number, strictly increasing per [`RemoteSink`]; the reply carries it back.
    pub(super) seq: u64,
    /// The work.
    pub(super) work: Work,
    /// The caller's timeout, also used as the remote `statement_timeout`.
    pub(super) timeout: Duration,
}

/// The sink thread's answer to request `seq`.
pub(super) struct Reply {
    /// The request's sequence number.
    pub(super) seq: u64,
    /// Rows of each statement, or the failure.
    pub(super) result: Result<Vec<Rows>, RemoteError>,
}

/// Request bookkeeping shared by both threads, always updated under its mutex.
#[derive(Default)]
pub(super) struct Control {
    /// The request the sink thread is executing, if any.
    pub(super) inflight: Option<u64>,
    /// True once the in-flight transaction has decided to send `COMMIT`.
    pub(super) committing: bool,
    /// Highest request sequence number the main thread has given up on.
    pub(super) abandoned: u64,
    /// When the main thread gave up on the in-flight request.
    pub(super) abandoned_at: Option<Instant>,
    /// How to cancel on the current connection.
    pub(super) cancel: Option<Canceller>,
    /// A cancel request was sent for the in-flight request: the connection must be dropped
    /// afterwards, lest the cancel hit a later request's statement.
    pub(super) cancel_fired: bool,
}

/// State shared between the main thread and one sink thread.
#[derive(Default)]
pub(super) struct Shared {
    /// Request bookkeeping. The sink thread sends each reply while holding this lock, so
    /// the main thread holding it sees either the reply in the channel or the request as
    /// unfinished — never a finished request whose reply is still to come.
    pub(super) ctl: Mutex<Control>,
    /// True while the sink thread holds an open connection.
    pub(super) connected: AtomicBool,
    /// Set when the sink thread must exit after its current request.
    pub(super) stop: AtomicBool,
}

/// Lock a mutex, ignoring poisoning (no code holding these locks can panic mid-update).
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The main thread's handle on one sink thread.
pub(super) struct Worker {
    /// Requests to the sink thread (bounded, [`REQUEST_QUEUE`]).
    pub(super) requests: SyncSender<Request>,
    /// Replies from the sink thread (unbounded, so the sink thread never blocks on a reply).
    pub(super) replies: Receiver<Reply>,
    /// The sink thread.
    pub(super) handle: JoinHandle<()>,
    /// Shared state.
    pub(super) shared: Arc<Shared>,
}

/// Main-thread state of a [`RemoteSink`].
pub(super) struct SinkState {
    /// The current sink thread, if one is running.
    pub(super) worker: Option<Worker>,
    /// Sink threads replaced because they were stuck, not yet exited.
    pub(super) retired: Vec<JoinHandle<()>>,
    /// Last request sequence number used.
    pub(super) next_seq: u64,
}

/// The remote PostgreSQL connection of one pipeline, owned by a dedicated thread.
///
/// Call it from one thread (the worker's main thread); calls are serialized internally.
pub struct RemoteSink {
    /// The caller's conninfo (may contain a password: never printed).
    pub(super) conninfo: String,
    /// The remote must be seen to ask for the password (see [`RemoteAccess`]).
    pub(super) probe_password: bool,
    /// Application name given to the remote connection.
    pub(super) application_name: String,
    /// Main-thread state.
    pub(super) state: Mutex<SinkState>,
}

impl fmt::Debug for RemoteSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteSink")
            .field("application_name", &self.application_name)
            .field("connected", &self.connected())
            .finish_non_exhaustive()
    }
}

/// What cancelling a connection's statement needs: its cancel token, and the TLS connector
/// it was made with (the cancel request goes over the same kind of connection).
#[derive(Clone)]
pub(super) struct Canceller {
    /// The connection's cancel token.
    pub(super) token: CancelToken,
    /// The TLS connector, if the connection used one.
    pub(super) tls: Option<MakeTlsConnector>,
}

/// Send a cancel request from a short-lived thread, so neither the main thread nor the
/// (blocked) sink thread waits for it.
pub(super) fn spawn_cancel(canceller: Canceller) {
    let _ = thread::Builder::new()
        .name("tide-sink-cancel".into())
        .spawn(move || {
            block_signals();
            let Canceller { token, tls } = canceller;
            let _ = catch_unwind(AssertUnwindSafe(|| match tls {
                Some(tls) => token.cancel_query(tls),
                None => token.cancel_query(NoTls),
            }));
        });
}

/// Start a sink thread.
pub(super) fn spawn_worker(
    conninfo: &str,
    application_name: &str,
    probe_password: bool,
) -> std::io::Result<Worker> {
    let (request_tx, request_rx) = mpsc::sync_channel(REQUEST_QUEUE);
    let (reply_tx, reply_rx) = mpsc::channel();
    let shared = Arc::new(Shared::default());
    let thread_shared = Arc::clone(&shared);
    let conninfo = conninfo.to_string();
    let application_name = application_name.to_string();
    let handle = thread::Builder::new()
        .name("tide-sink".into())
        .spawn(move || {
            sink_thread(
                &conninfo,
                &application_name,
                probe_password,
                request_rx,
                reply_tx,
                &thread_shared,
            )
        })?;
    Ok(Worker {
        requests: request_tx,
        replies: reply_rx,
        handle,
        shared,
    })
}

impl RemoteSink {
    /// Start the sink thread. `conninfo` is a libpq-style key=value string (host, port, dbname,
    /// user, password, sslmode=disable, ...) built by the caller; connect lazily in the thread
    /// (the first request connects), with connect_timeout (default 5 s) and a TCP keepalive.
    ///
    /// A `postgresql://` URI is accepted too. A non-empty `application_name` overrides one in
    /// `conninfo`. An invalid conninfo is reported (non-transient) by the first request. If the
    /// thread cannot be spawned, requests report it (transient) and retry spawning.
    pub fn start(conninfo: String, application_name: &str) -> RemoteSink {
        RemoteSink::start_with(
            RemoteAccess {
                conninfo,
                probe_password: false,
            },
            application_name,
        )
    }

    /// [`RemoteSink::start`] with what [`remote_access`] decided: when `probe_password`, every
    /// connection is made so that it is known to use its password, and one the remote lets in
    /// without asking for it is refused with "password is required" ([`PASSWORD_REQUIRED`]).
    pub fn start_with(access: RemoteAccess, application_name: &str) -> RemoteSink {
        let RemoteAccess {
            conninfo,
            probe_password,
        } = access;
        let worker = spawn_worker(&conninfo, application_name, probe_password).ok();
        RemoteSink {
            conninfo,
            probe_password,
            application_name: application_name.to_string(),
            state: Mutex::new(SinkState {
                worker,
                retired: Vec::new(),
                next_seq: 0,
            }),
        }
    }

    /// What this sink connects with.
    pub fn access(&self) -> RemoteAccess {
        RemoteAccess {
            conninfo: self.conninfo.clone(),
            probe_password: self.probe_password,
        }
    }

    /// Run statements in ONE remote transaction, then commit. All or nothing: on any error
    /// the remote transaction is rolled back and the error returned; on a broken connection
    /// the client is dropped and the next request reconnects.
    ///
    /// Returns the rows of every statement, in order. `timeout` bounds the whole call
    /// (connecting included) and is the remote `statement_timeout` of each statement. On
    /// timeout the error is transient and the remote transaction is rolled back — unless
    /// `COMMIT` was already sent: then the call waits up to `timeout` more for its outcome,
    /// and if it still has none, returns a transient error saying the outcome is unknown.
    /// An empty `stmts` returns `Ok(vec![])` without contacting the remote. `timeout` should
    /// be well above the round-trip time (a zero timeout always fails).
    ///
    /// Statements of one call are pipelined in order over one round trip each (plus one for
    /// `BEGIN` and one for `COMMIT`); a statement's text is prepared once per connection and
    /// the prepared statement reused.
    pub fn transaction(
        &self,
        stmts: Vec<RemoteStatement>,
        timeout: Duration,
    ) -> Result<Vec<Vec<Vec<Option<String>>>>, RemoteError> {
        self.transaction_steps(
            stmts.into_iter().map(RemoteStep::Statement).collect(),
            timeout,
        )
    }

    /// [`RemoteSink::transaction`] with steps that may also be simple-protocol SQL or a
    /// `COPY ... FROM STDIN` with its data ([`RemoteStep`]). Same guarantees (all or nothing,
    /// bounded by `timeout`, each step under the remote `statement_timeout`; a COPY is
    /// cancelled like a statement). Returns one entry per step: the rows of a
    /// [`RemoteStep::Statement`], none for the others.
    pub fn transaction_steps(
        &self,
        steps: Vec<RemoteStep>,
        timeout: Duration,
    ) -> Result<Vec<Vec<Vec<Option<String>>>>, RemoteError> {
        if steps.is_empty() {
            return Ok(Vec::new());
        }
        self.call(Work::Transaction(steps, None), timeout)
    }

    /// One part of a remote transaction too large to send at once: the first part (`continues`
    /// false) begins it, a part with `commit` commits it, every other part leaves it open on the
    /// connection. Guarantees: all or nothing as [`RemoteSink::transaction_steps`] — a part that
    /// fails, times out or finds that the connection lost the transaction its `id` names rolls
    /// it back and returns an error, and the caller must send the whole transaction again from
    /// its first part; a first part finding another transaction open (one a failed caller left)
    /// rolls that back first. Only one transaction is open per sink at a time, and queries sent
    /// meanwhile ([`RemoteSink::query`]) run inside it.
    pub fn transaction_part(
        &self,
        steps: Vec<RemoteStep>,
        part: Part,
        timeout: Duration,
    ) -> Result<Vec<Vec<Vec<Option<String>>>>, RemoteError> {
        self.call(Work::Transaction(steps, Some(part)), timeout)
    }

    /// Run one statement outside an explicit transaction and return its rows as text
    /// (use simple-query or text-typed results: every column as its text output, NULL as None).
    ///
    /// The statement runs on its own (autocommit); parameters and result columns follow the
    /// rules of [`RemoteStatement`]. `timeout` bounds the call and is the statement's remote
    /// `statement_timeout`.
    pub fn query(
        &self,
        sql: &str,
        params: Vec<Option<String>>,
        timeout: Duration,
    ) -> Result<Vec<Vec<Option<String>>>, RemoteError> {
        let statement = RemoteStatement {
            sql: sql.to_string(),
            params,
        };
        let mut results = self.call(Work::Query(statement), timeout)?;
        Ok(results.pop().unwrap_or_default())
    }

    /// True if the thread currently holds an open connection (for the view).
    ///
    /// A connection the server closed while idle counts as open until the next request
    /// notices.
    pub fn connected(&self) -> bool {
        let state = lock(&self.state);
        state
            .worker
            .as_ref()
            .is_some_and(|w| w.shared.connected.load(Ordering::SeqCst))
    }

    /// Send a request to the sink thread and wait for its reply.
    pub(super) fn call(&self, work: Work, timeout: Duration) -> Result<Vec<Rows>, RemoteError> {
        let mut state = lock(&self.state);
        state.retired.retain(|h| !h.is_finished());
        state.next_seq += 1;
        let seq = state.next_seq;
        let mut request = Request { seq, work, timeout };
        for _ in 0..2 {
            let dead = state.worker.as_ref().is_none_or(|w| w.handle.is_finished());
            if dead {
                if let Some(old) = state.worker.take() {
                    let _ = old.handle.join(); // finished: returns at once
                }
                let worker =
                    spawn_worker(&self.conninfo, &self.application_name, self.probe_password)
                        .map_err(|e| {
                            RemoteError::transient(format!(
                                "could not start the remote sink thread: {e}"
                            ))
                        })?;
                state.worker = Some(worker);
            }
            let Some(worker) = state.worker.as_ref() else {
                break;
            };
            while worker.replies.try_recv().is_ok() {} // replies to abandoned requests
            match worker.requests.try_send(request) {
                Ok(()) => return wait_for_reply(worker, seq, timeout),
                Err(TrySendError::Disconnected(r)) => {
                    // The thread exited (it should not): start another one.
                    request = r;
                    if let Some(old) = state.worker.take() {
                        state.retired.push(old.handle);
                    }
                }
                Err(TrySendError::Full(r)) => {
                    // Still busy with an abandoned request. If it has been stuck for long,
                    // leave that thread behind and start another one.
                    request = r;
                    if !is_stuck(&worker.shared) || state.retired.len() >= MAX_RETIRED {
                        return Err(RemoteError::transient(
                            "the remote sink is still busy with an earlier request that did not \
                             finish in time",
                        ));
                    }
                    if let Some(old) = state.worker.take() {
                        retire(&old);
                        state.retired.push(old.handle);
                    }
                }
            }
        }
        Err(RemoteError::transient(
            "the remote sink thread is not running",
        ))
    }

    /// Stop the sink thread: tell it to stop, cancel what it runs, wait up to `wait` for it
    /// to exit. True if it exited (or none was running); false if it was left detached (it
    /// exits by itself once its blocked network call returns).
    pub(super) fn shutdown(&mut self, wait: Duration) -> bool {
        let state = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        let Some(worker) = state.worker.take() else {
            return true;
        };
        retire(&worker);
        let Worker {
            requests,
            replies,
            handle,
            ..
        } = worker;
        drop(requests); // wakes the thread if idle
        let deadline = Instant::now() + wait;
        while !handle.is_finished() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(5));
        }
        drop(replies);
        if handle.is_finished() {
            let _ = handle.join();
            true
        } else {
            false
        }
    }
}

impl Drop for RemoteSink {
    /// Tell the thread to stop, cancel its in-flight statement, join it (waiting at most
    /// [`STOP_WAIT`]; a thread blocked in network I/O is detached and exits on its own).
    fn drop(&mut self) {
        self.shutdown(STOP_WAIT);
    }
}

/// True if the worker's in-flight request was abandoned more than [`STUCK_AFTER`] ago.
pub(super) fn is_stuck(shared: &Shared) -> bool {
    let ctl = lock(&shared.ctl);
    ctl.inflight.is_some_and(|s| s <= ctl.abandoned)
        && ctl
            .abandoned_at
            .is_some_and(|at| at.elapsed() >= STUCK_AFTER)
}

/// Tell a sink thread to exit after its current request, cancelling that request.
pub(super) fn retire(worker: &Worker) {
    worker.shared.stop.store(true, Ordering::SeqCst);
    let mut ctl = lock(&worker.shared.ctl);
    if let Some(seq) = ctl.inflight {
        ctl.abandoned = ctl.abandoned.max(seq);
        if let Some(canceller) = ctl.cancel.clone() {
            ctl.cancel_fired = true;
            spawn_cancel(canceller);
        }
    }
}

/// Wait for the reply to `seq`, discarding stale replies; on timeout, abandon the request.
pub(super) fn wait_for_reply(
    worker: &Worker,
    seq: u64,
    timeout: Duration,
) -> Result<Vec<Rows>, RemoteError> {
    if let Some(reply) = receive(worker, seq, timeout) {
        return reply;
    }
    let mut ctl = lock(&worker.shared.ctl);
    // The reply may have been sent just before we took the lock.
    if let Some(reply) = receive(worker, seq, Duration::ZERO) {
        return reply;
    }
    if ctl.inflight == Some(seq) && ctl.committing {
        // COMMIT is on its way: abandoning now would not undo it. Wait for the outcome.
        drop(ctl);
        if let Some(reply) = receive(worker, seq, timeout) {
            return reply;
        }
        let mut ctl = lock(&worker.shared.ctl);
        if let Some(reply) = receive(worker, seq, Duration::ZERO) {
            return reply;
        }
        abandon(&mut ctl, seq);
        return Err(RemoteError::transient(format!(
            "the remote did not confirm COMMIT within {}; the outcome of the transaction is unknown",
            fmt_duration(timeout.saturating_mul(2))
        )));
    }
    abandon(&mut ctl, seq);
    Err(RemoteError::transient(format!(
        "the remote did not answer within {}",
        fmt_duration(timeout)
    )))
}

/// Give up on request `seq` (lock held): the sink thread will skip it if not started, roll
/// it back and drop the connection if running; its statement is cancelled.
pub(super) fn abandon(ctl: &mut Control, seq: u64) {
    ctl.abandoned = ctl.abandoned.max(seq);
    if ctl.inflight == Some(seq) {
        ctl.abandoned_at = Some(Instant::now());
        if let Some(canceller) = ctl.cancel.clone() {
            ctl.cancel_fired = true;
            spawn_cancel(canceller);
        }
    }
}

/// Wait up to `wait` for the reply to `seq`; `None` on timeout. A vanished sink thread
/// yields an error reply. The wait is `target::wait`'s: an interrupt abandons the request first;
/// a zero `wait` (called with the control lock held) never looks at interrupts.
pub(super) fn receive(
    worker: &Worker,
    seq: u64,
    wait: Duration,
) -> Option<Result<Vec<Rows>, RemoteError>> {
    let waited = crate::target::wait::reply(
        &worker.replies,
        wait,
        None,
        |r: Reply| (r.seq == seq).then_some(r.result),
        &mut || abandon(&mut lock(&worker.shared.ctl), seq),
    );
    match waited {
        Waited::Reply(r) => Some(r),
        Waited::TimedOut => None,
        Waited::Gone => Some(Err(RemoteError::transient(
            "the remote sink thread stopped unexpectedly",
        ))),
    }
}

/// A duration for messages: "1.5 s", "250 ms".
pub(super) fn fmt_duration(d: Duration) -> String {
    if d >= Duration::from_secs(1) {
        format!("{} s", d.as_secs_f64())
    } else {
        format!("{} ms", d.as_millis())
    }
}
