use portcullis::store::{FileStore, Store, SyncPolicy};
fn main() {
    let dir = std::env::args().nth(1).unwrap();
    let t = std::time::Instant::now();
    let store = FileStore::builder(&dir)
        .sync_policy(SyncPolicy::SyncEveryCommit)
        .open()
        .unwrap();
    store.wait_for_background_compactions();
    store.close().unwrap();
    println!("settled in {:?}", t.elapsed());
}
