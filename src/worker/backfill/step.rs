//! Reading chunks between stream iterations: the chunks asked of the readers received and
//! registered, the next chunk of each backfill that may progress read (its low watermark, then
//! its SELECT and high watermark), and the key ranges of the next chunks planned.

use super::*;

impl Backfiller {
    /// Receive the chunks asked of the readers, then read the next chunk of each backfill that
    /// may progress (`tide.max_parallel_backfills`) and has none in memory, and plan the key
    /// ranges its readers will read next ([`ranges::plan`]). Runs their transactions (two per
    /// chunk read here); call it between stream iterations. `sink` is the pipeline's target,
    /// when it exists yet: it says how it takes the chunks' rows.
    pub fn step(&mut self, pipeline: &str, sink: &mut Option<Box<dyn Target>>) -> TideResult<()> {
        if self.pipeline != pipeline {
            self.pipeline = pipeline.to_string();
        }
        let received = self.receive(pipeline, sink);
        // `tide.read_ahead` turned off or fewer readers (a reload): idle readers go.
        let readers = if crate::gucs::READ_AHEAD.get() {
            crate::gucs::MAX_BACKFILL_READERS.get().max(1) as usize
        } else {
            0
        };
        if self.readers.len() > readers {
            self.readers.truncate(readers);
        }
        received?;
        let parallel = crate::gucs::MAX_PARALLEL_BACKFILLS.get().max(1) as usize;
        if self.readers.len() > 1 && Instant::now() >= self.not_before {
            // Several readers: the next chunks of backfills with none in memory are read by
            // them at once, and received now (asked between iterations, they must be
            // registered before the next one); the worker reads what is left itself.
            self.ask_readers(pipeline, sink, parallel)?;
            self.receive(pipeline, sink)?;
        }
        while self.running() < parallel && Instant::now() >= self.not_before {
            if !self.read_one(pipeline, sink, parallel)? {
                break;
            }
        }
        if (self.sched.chunks()).any(|(_, p)| p.job.rows_per_second.is_none()) {
            self.start_readers(pipeline, readers);
        }
        self.plan(pipeline);
        Ok(())
    }

    /// Receive every chunk asked of a reader (each must be registered before the next
    /// iteration decodes further: see `read_ahead`). A reader that is gone is dropped (the
    /// worker reads its chunk itself); the first error registering a chunk is returned after
    /// all were received.
    fn receive(&mut self, pipeline: &str, sink: &mut Option<Box<dyn Target>>) -> TideResult<()> {
        let mut first_error = None;
        let mut gone = Vec::new();
        for i in 0..self.readers.len() {
            if !self.readers[i].in_flight() {
                continue;
            }
            let started = Instant::now();
            match self.readers[i].receive() {
                // Asked by an iteration that failed: dropped; the next step reads again.
                Ok(None) => {}
                Ok(Some((job, read))) => {
                    let read = sweep(sink.as_deref_mut(), &job, read);
                    if let Err(e) = self.register(pipeline, job, read, started) {
                        first_error.get_or_insert(e);
                    }
                }
                Err(e) => {
                    pgrx::log!("pg_tide worker \"{pipeline}\": {e}; it reads the chunks itself");
                    gone.push(i);
                    self.reader_retry = Instant::now() + Duration::from_secs(30);
                }
            }
        }
        for i in gone.into_iter().rev() {
            self.readers.remove(i);
        }
        // Nothing is in flight now: the pruning skipped meanwhile (see `prune`).
        self.prune();
        first_error.map_or(Ok(()), Err)
    }

    /// Ask each idle reader for the next chunk of a backfill that may progress, has no chunk in
    /// memory and no hold, and is not throttled (the worker paces those itself), in the order
    /// `backfills::due` gives them. A backfill whose rows' form cannot be decided now (its
    /// table gone, a remote target that does not answer) is left to the worker's own read.
    fn ask_readers(
        &mut self,
        pipeline: &str,
        sink: &mut Option<Box<dyn Target>>,
        parallel: usize,
    ) -> TideResult<()> {
        let Some(sink) = sink.as_deref_mut() else {
            return Ok(());
        };
        let now = Instant::now();
        self.held.expire(now);
        let busy: HashSet<i64> = self.sched.backfills().into_iter().collect();
        let room = parallel.saturating_sub(busy.len());
        let idle: Vec<usize> = (0..self.readers.len())
            .filter(|&i| !self.readers[i].in_flight())
            .collect();
        let mut idle = idle.into_iter();
        let due =
            tx::run(|| backfills::due(pipeline, i32::try_from(parallel).unwrap_or(i32::MAX)))?;
        let mut gone = None;
        for mut b in due
            .into_iter()
            .filter(|b| !busy.contains(&b.id) && !is_held(&self.held, b, now))
            .filter(|b| b.rows_per_second.is_none())
            .take(room)
        {
            let Some(i) = idle.next() else {
                break;
            };
            let Ok(Some(form)) = tx::run(|| wanted_form(pipeline, &b, sink)) else {
                continue;
            };
            b.chunk_size = b.chunk_size.max(1);
            b.chunk_cap = self.chunk_cap();
            if let Err(e) = self.readers[i].request(&b, form, 0) {
                pgrx::log!("pg_tide worker \"{pipeline}\": {e}; it reads the chunks itself");
                gone = Some(i);
                break;
            }
        }
        if let Some(i) = gone {
            self.readers.remove(i);
        }
        Ok(())
    }

    /// How many backfills have chunks in memory.
    fn running(&self) -> usize {
        self.sched.backfills().len()
    }

    /// With several readers: plan the key ranges of the next chunks of each backfill in memory
    /// ([`ranges::plan`]) from where its next unread chunk starts, unless planned from there
    /// already. A probe that fails leaves the backfill to read one chunk at a time.
    fn plan(&mut self, pipeline: &str) {
        let cap = self.chunk_cap();
        if !self.plans.begin(self.readers.len(), cap) {
            return;
        }
        let ids = self.sched.backfills();
        let wanted: Vec<(i64, Option<Vec<String>>, backfills::Due)> = (ids.iter())
            .filter_map(|id| self.sched.last_of(*id))
            .filter(|p| !p.is_last && plannable(&p.job))
            .filter(|p| self.plans.wanted(p.backfill_id, &p.key_to))
            .map(|p| (p.backfill_id, p.key_to.clone(), p.job.clone()))
            .collect();
        self.plans.retain(|id| ids.contains(&id));
        for (id, from, mut job) in wanted {
            job.chunk_cap = cap;
            match ranges::plan(&job, from.as_deref(), self.readers.len() - 1) {
                Ok(bounds) => {
                    self.plans.insert(id, from, bounds);
                }
                Err(e) => pgrx::log!(
                    "pg_tide worker \"{pipeline}\": cannot plan the next chunks of backfill {id} ({e}); they are read one at a time"
                ),
            }
        }
    }

    /// Read one chunk, of the first backfill that may progress and has no chunk in memory and
    /// no hold ([`Self::held`]): its low watermark, then the chunk and its high watermark.
    /// `false` when there was none to read.
    fn read_one(
        &mut self,
        pipeline: &str,
        sink: &mut Option<Box<dyn Target>>,
        parallel: usize,
    ) -> TideResult<bool> {
        crate::worker::origin::ensure_not_held("a backfill chunk's watermarks are written")?;
        let now = Instant::now();
        self.held.expire(now);
        let busy = self.sched.backfills();
        let held = self.held.clone();
        let cap = self.chunk_cap();
        let Some(job) = tx::run(|| low_watermark(pipeline, parallel, &busy, &held, cap))? else {
            if !self.sched.has_chunks() {
                // Nothing to read: look again in a while (start_backfill wakes the worker
                // anyway), or when a throttled backfill's time comes (sooner: it may be paused,
                // cancelled or altered meanwhile).
                let wait = if self.held.is_empty() { 500 } else { 200 };
                let soonest = self.held.soonest();
                let by = now + Duration::from_millis(wait);
                self.not_before = soonest.map_or(by, |s| s.min(by));
                // No backfill: no reader (it would hold a background worker slot for nothing).
                if self.held.is_empty() {
                    self.readers.clear();
                }
            }
            return Ok(false);
        };
        let started = Instant::now();
        let Some(sink) = sink.as_deref_mut() else {
            // No target yet (the first iteration makes it): it decides how the rows are held.
            // The low watermark alone is ignored by the stream.
            self.not_before = Instant::now() + Duration::from_millis(200);
            return Ok(false);
        };
        // The table's lock before the chunk's snapshot (see `tx::run_locked`).
        let read = read_chunk_locked(
            pipeline,
            &job,
            &mut |meta| form_for(sink, job.b.relid, &meta.shape()),
            None,
        );
        let read = sweep(Some(sink), &job, read);
        self.register(pipeline, job, read, started)?;
        Ok(true)
    }

    /// Start readers until there are `wanted`, unless one failed to start lately. Outside a
    /// transaction.
    fn start_readers(&mut self, pipeline: &str, wanted: usize) {
        while self.readers.len() < wanted && Instant::now() >= self.reader_retry {
            match Reader::start(pipeline) {
                Ok(r) => self.readers.push(r),
                Err(e) => {
                    pgrx::log!(
                        "pg_tide worker \"{pipeline}\": no reader ({e}); it reads the chunks itself"
                    );
                    self.reader_retry = Instant::now() + Duration::from_secs(60);
                }
            }
        }
    }

    /// Take a chunk read for `job` (by this worker or its reader): register it with the
    /// reconciler, or note why it could not be read.
    fn register(
        &mut self,
        pipeline: &str,
        job: Job,
        read: TideResult<ChunkRead>,
        started: Instant,
    ) -> TideResult<()> {
        let read = match read {
            Ok(r) => {
                self.waiting_noted.remove(&job.b.id);
                r
            }
            Err(e) if e.retry => {
                pgrx::debug1!(
                    "pg_tide worker \"{pipeline}\": chunk {} of backfill {} is read again later: {}",
                    job.b.chunk_no,
                    job.b.id,
                    e.message
                );
                // Nothing was read: the low watermark alone is ignored by the stream. Say why
                // in tide.backfills (once; the next emitted chunk clears it). The other
                // backfills go on meanwhile.
                (self.held).hold(job.b.id, Instant::now() + Duration::from_millis(200), false);
                if self.waiting_noted.insert(job.b.id) {
                    let remedy = e.hint.clone().unwrap_or_default();
                    let waiting = format!("waiting: {}", e.message);
                    if let Err(e2) =
                        tx::run(|| backfills::note_waiting(job.b.id, &waiting, &remedy))
                    {
                        pgrx::log!("pg_tide worker \"{pipeline}\": could not note why backfill {} waits: {e2}", job.b.id);
                    }
                }
                return Ok(());
            }
            Err(mut e) => {
                if e.code == pgrx::pg_sys::errcodes::PgSqlErrorCode::ERRCODE_QUERY_CANCELED {
                    e = TideError::new(
                        e.code,
                        format!(
                            "a chunk of backfill {} was cancelled ({}): its SELECT may run for at most tide.chunk_timeout ({} ms)",
                            job.b.id,
                            e.message,
                            crate::gucs::CHUNK_TIMEOUT_MS.get()
                        ),
                    )
                    .hint("Make the condition cheaper (an index on what it tests), raise tide.chunk_timeout, or start the backfill again without the condition.");
                }
                let _ = tx::run(|| fail_backfill(job.b.id, &e));
                return Err(e);
            }
        };
        // A transaction the stream already delivered that the chunk's snapshot does not see yet
        // (see `DeliveredXids`): its rows may be older than the target's. Read it again.
        if self.delivered.missed_by(job.b.relid, &read.invisible) {
            pgrx::debug1!(
                "pg_tide worker \"{pipeline}\": chunk {} of backfill {} missed a delivered transaction; read again",
                job.b.chunk_no,
                job.b.id
            );
            (self.held).hold(job.b.id, Instant::now() + Duration::from_millis(20), false);
            return Ok(());
        }
        if let Some(xmin) = read.invisible.xmin {
            self.delivered.forget_before(xmin);
        }
        let n = read.rows.len();
        let key_to = chunk_end(&job.b, &read.rows);
        let mut rows: Vec<(String, Row)> = read.rows.into_iter().map(|r| (r.key, r.row)).collect();
        rows.extend(
            read.deletes
                .into_iter()
                .map(|(k, by_name)| (k, Row::Key(by_name))),
        );
        // Throttle: spread the rows of this chunk over rows / rows_per_second seconds before
        // this backfill's next chunk (no other backfill waits for it).
        match job.b.rows_per_second {
            Some(rps) if rps > 0 && !read.is_last => {
                let until = started + Duration::from_secs_f64(n as f64 / rps as f64);
                self.held.hold(job.b.id, until, true);
            }
            _ => self.held.release(job.b.id),
        }
        let (id, no, wm, relid) = (job.b.id, job.b.chunk_no, job.watermark, job.b.relid);
        let chunk = PendingChunk {
            backfill_id: job.b.id,
            chunk_no: job.b.chunk_no,
            relid: job.b.relid,
            relation: read.relation,
            key_from: job.b.last_key.clone(),
            key_to,
            rows_read: n,
            is_last: read.is_last,
            read_at: read.read_at,
            low_lsn: None,
            truncated: false,
            columns: read.columns,
            values: read.values,
            attnums: read.attnums,
            invisible: read.invisible,
            estimate: read.estimate,
            job: job.b,
            form: read.form,
        };
        self.sched.add(id, no, wm, relid, rows, chunk);
        Ok(())
    }
}

/// A resync's chunk at a target in another PostgreSQL: the target's keys in the chunk's key
/// range that the chunk did not find at the source join its rows as deletes (see
/// `chunk::sweep_deletes`; a local table target's are found in the chunk's own snapshot). The
/// target is asked between stream iterations, before the stream reaches the chunk's low
/// watermark; when it cannot answer, the chunk is read again later. Other chunks pass as they are.
fn sweep(
    sink: Option<&mut (dyn Target + 'static)>,
    job: &Job,
    read: TideResult<ChunkRead>,
) -> TideResult<ChunkRead> {
    let mut read = read?;
    if !job.b.resync {
        return Ok(read);
    }
    let Some(sink) = sink else {
        return Err(
            TideError::internal("the target is not ready to sweep a resync's chunk").retry_later(),
        );
    };
    let upper = if read.is_last {
        None
    } else {
        chunk_end(&job.b, &read.rows)
    };
    let found = sink
        .sweep_keys(
            job.b.relid,
            &job.b.key_columns,
            job.b.last_key.as_deref(),
            upper.as_deref(),
        )
        .map_err(TideError::retry_later)?;
    let Some(found) = found else {
        return Ok(read);
    };
    let deletes = tx::run(|| sweep_deletes(job, &read, found))?;
    read.deletes.extend(deletes);
    Ok(read)
}

/// Whether backfill `b` must not be read now: a hold in `held` that has not passed, unless it is
/// a throttle the backfill no longer has.
fn is_held(held: &Holds<i64>, b: &backfills::Due, now: Instant) -> bool {
    held.holds(b.id, b.rows_per_second.is_some_and(|r| r > 0), now)
}

/// Whether the chunks of backfill `b` may be read on planned key ranges, several at once: not a
/// repair's or a resync's (their deletes are found per chunk range as one reader reads them) nor
/// a throttled one's.
pub(super) fn plannable(b: &backfills::Due) -> bool {
    b.repair_deletes.is_none() && !b.resync && b.sweep.is_none() && b.rows_per_second.is_none()
}

/// Transaction 1: pick the backfill (the first of those that may progress, [`backfills::due`],
/// that has no chunk in memory, `busy`, and is not held: a hold in `held` that has not passed,
/// unless it is a throttle the backfill no longer has), mark it running, write the LW.
fn low_watermark(
    pipeline: &str,
    parallel: usize,
    busy: &[i64],
    held: &Holds<i64>,
    cap: Option<i64>,
) -> TideResult<Option<Job>> {
    let now = Instant::now();
    let due = backfills::due(pipeline, i32::try_from(parallel).unwrap_or(i32::MAX))?;
    let Some(mut b) = due
        .into_iter()
        .find(|b| !busy.contains(&b.id) && !is_held(held, b, now))
    else {
        return Ok(None);
    };
    b.chunk_size = b.chunk_size.max(1);
    b.chunk_cap = cap;
    let watermark = chunks::next_watermark(pipeline)?;
    chunks::write_low_watermark(pipeline, b.id, watermark, b.chunk_no)?;
    Ok(Some(Job { watermark, b }))
}

fn fail_backfill(id: i64, e: &TideError) -> TideResult<()> {
    let remedy = e.hint.clone().unwrap_or_else(|| {
        "Fix the cause, then start the backfill again with tide.start_backfill.".to_string()
    });
    backfills::fail(id, &e.message, &e.sqlstate(), &remedy)
}
