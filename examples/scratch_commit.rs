use portcullis::store::{Batch, FileStore, Partition, Store};
use std::time::Instant;
fn main() {
    for threads in [1usize, 4, 16, 64] {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::open(dir.path()).unwrap();
        let total = 4000usize;
        let per = total / threads;
        let t0 = Instant::now();
        std::thread::scope(|s| {
            for t in 0..threads {
                let store = &store;
                s.spawn(move || {
                    let p = Partition::new(format!("t{t}")).unwrap();
                    for i in 0..per {
                        let _ = store
                            .apply(
                                &p,
                                &Batch::new()
                                    .put((i as u32).to_be_bytes().to_vec(), vec![0u8; 128]),
                            )
                            .unwrap();
                    }
                });
            }
        });
        let el = t0.elapsed();
        let st = store.stats();
        println!(
            "{threads:>3} threads: {:>8.0} commits/s, {:.1} batches/sync",
            (per * threads) as f64 / el.as_secs_f64(),
            st.batches as f64 / st.syncs as f64
        );
    }
}
