//! What pg_tide's main thread does with its sink threads, timed with std's channel and mutex
//! and with crossbeam-channel's and parking_lot's:
//!
//! - a request/reply round trip: the main thread sends a request on a bounded channel of one
//!   slot, the sink thread answers on another channel, the main thread waits for the answer with
//!   `recv_timeout` (pg_tide waits in slices of 100 ms, looking at PostgreSQL's interrupt flags
//!   between them; an answer ends a slice at once);
//! - an uncontended and a two-thread contended lock/unlock of the shared control state.
//!
//! Prints the median of 7 runs of each, in nanoseconds per operation.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

const ROUND_TRIPS: u32 = 20_000;
const LOCKS: u32 = 2_000_000;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn std_round_trips() -> f64 {
    let (req_tx, req_rx) = std::sync::mpsc::sync_channel::<u64>(1);
    let (rep_tx, rep_rx) = std::sync::mpsc::channel::<u64>();
    let t = thread::spawn(move || {
        while let Ok(x) = req_rx.recv() {
            if rep_tx.send(x + 1).is_err() {
                break;
            }
        }
    });
    let start = Instant::now();
    for i in 0..ROUND_TRIPS as u64 {
        req_tx.send(i).unwrap();
        let r = rep_rx.recv_timeout(Duration::from_millis(100)).unwrap();
        assert_eq!(r, i + 1);
    }
    let ns = start.elapsed().as_nanos() as f64 / f64::from(ROUND_TRIPS);
    drop(req_tx);
    t.join().unwrap();
    ns
}

fn crossbeam_round_trips() -> f64 {
    let (req_tx, req_rx) = crossbeam_channel::bounded::<u64>(1);
    let (rep_tx, rep_rx) = crossbeam_channel::unbounded::<u64>();
    let t = thread::spawn(move || {
        while let Ok(x) = req_rx.recv() {
            if rep_tx.send(x + 1).is_err() {
                break;
            }
        }
    });
    let timeout = crossbeam_channel::after(Duration::from_secs(3600));
    let start = Instant::now();
    for i in 0..ROUND_TRIPS as u64 {
        req_tx.send(i).unwrap();
        // What a select! over the reply and a slice's timer would be.
        let r = crossbeam_channel::select! {
            recv(rep_rx) -> r => r.unwrap(),
            recv(timeout) -> _ => panic!("timeout"),
        };
        assert_eq!(r, i + 1);
    }
    let ns = start.elapsed().as_nanos() as f64 / f64::from(ROUND_TRIPS);
    drop(req_tx);
    t.join().unwrap();
    ns
}

fn locks<M: Send + Sync + 'static>(m: Arc<M>, lock: fn(&M), contended: bool) -> f64 {
    let other = contended.then(|| {
        let m = Arc::clone(&m);
        thread::spawn(move || {
            for _ in 0..LOCKS {
                lock(&m);
            }
        })
    });
    let start = Instant::now();
    for _ in 0..LOCKS {
        lock(&m);
    }
    let ns = start.elapsed().as_nanos() as f64 / f64::from(LOCKS);
    if let Some(t) = other {
        t.join().unwrap();
    }
    ns
}

fn std_lock(m: &std::sync::Mutex<u64>) {
    *m.lock().unwrap_or_else(|p| p.into_inner()) += 1;
}

fn pl_lock(m: &parking_lot::Mutex<u64>) {
    *m.lock() += 1;
}

fn main() {
    let runs = 7;
    let m = |f: &dyn Fn() -> f64| median((0..runs).map(|_| f()).collect());
    println!("operation\tstd\tcrossbeam/parking_lot\t(ns per operation, median of {runs})");
    println!(
        "request/reply round trip\t{:.0}\t{:.0}",
        m(&std_round_trips),
        m(&crossbeam_round_trips)
    );
    println!(
        "mutex lock+unlock, uncontended\t{:.1}\t{:.1}",
        m(&|| locks(Arc::new(std::sync::Mutex::new(0)), std_lock, false)),
        m(&|| locks(Arc::new(parking_lot::Mutex::new(0)), pl_lock, false))
    );
    println!(
        "mutex lock+unlock, two threads\t{:.1}\t{:.1}",
        m(&|| locks(Arc::new(std::sync::Mutex::new(0)), std_lock, true)),
        m(&|| locks(Arc::new(parking_lot::Mutex::new(0)), pl_lock, true))
    );
}
