//! The images and chains of incremental checkpoints, on small files.

use super::*;
use crate::launcher::snapshot::manifest::RAM_FILE;

const PAGES: usize = 1024; // 4 MiB: four chunks.

/// A page of `byte`s, or zeros for 0.
fn page(byte: u8) -> Vec<u8> {
    vec![byte; PAGE]
}

/// Writes a sparse image of `PAGES` pages: `pages` gives (index, byte).
fn image(path: &Path, pages: &[(usize, u8)]) {
    let file = File::create(path).unwrap();
    file.set_len((PAGES * PAGE) as u64).unwrap();
    for &(index, byte) in pages {
        file.write_all_at(&page(byte), (index * PAGE) as u64)
            .unwrap();
    }
}

/// A checkpoint folder in `root` named `id`; its RAM the full `content`
/// (`File`) or a diff of it against `base`.
fn checkpoint(root: &Path, id: &str, content: &[(usize, u8)], base: Option<&str>) -> PathBuf {
    let folder = root.join(id);
    fs::create_dir_all(&folder).unwrap();
    let mut manifest = super::super::manifest::tests::ephemeral(id);
    manifest.ephemeral = false;
    manifest.created_at_unix_ms = 1;
    match base {
        None => image(&folder.join(RAM_FILE), content),
        Some(base) => {
            let whole = root.join(format!("{id}.whole"));
            image(&whole, content);
            let chain = Chain::open(root, &root.join(base)).unwrap().unwrap();
            write(
                &whole,
                &chain,
                &folder.join(RAM_FILE),
                &folder.join(PAGES_FILE),
            )
            .unwrap();
            manifest.ram = RamImage::Diff;
            manifest.ram_base = Some(base.to_owned());
        }
    }
    write_manifest(&folder, &manifest).unwrap();
    folder
}

/// The content a chain reads, page by page (0 for a zero page).
fn read_chain(root: &Path, id: &str) -> Vec<u8> {
    let chain = Chain::open(root, &root.join(id)).unwrap().unwrap();
    (0..PAGES)
        .map(|index| chain.page(index).map_or(0, |page| page[0]))
        .collect()
}

fn expected(pages: &[(usize, u8)]) -> Vec<u8> {
    let mut all = vec![0; PAGES];
    for &(index, byte) in pages {
        all[index] = byte;
    }
    all
}

#[test]
fn a_diff_keeps_only_changed_pages_and_reads_back_whole() {
    let root = tempfile::tempdir().unwrap();
    let root = root.path();
    let first = [(0, 1), (1, 2), (300, 3), (600, 4), (1023, 5)];
    checkpoint(root, "a", &first, None);
    // Page 1 changes, 300 becomes zero, 700 and 701 appear; the rest as before.
    let second = [(0, 1), (1, 9), (600, 4), (700, 7), (701, 7), (1023, 5)];
    let b = checkpoint(root, "b", &second, Some("a"));
    let pages = read_pages(&b, (PAGES * PAGE) as u64).unwrap();
    let changed: Vec<usize> = (0..PAGES).filter(|&p| pages.get(p)).collect();
    assert_eq!(changed, vec![1, 300, 700, 701]);
    // Three pages of data; the page that became zero is a hole.
    assert_eq!(allocated_bytes(&b.join(RAM_FILE)), 3 * PAGE as u64);
    assert_eq!(read_chain(root, "b"), expected(&second));
    assert_eq!(read_chain(root, "a"), expected(&first));
}

/// `c`, a diff of `b`, a diff of the whole `a`; and what `c` holds.
fn three_deep(root: &Path) -> (PathBuf, [(usize, u8); 4]) {
    checkpoint(root, "a", &[(5, 1), (6, 1), (900, 1)], None);
    checkpoint(root, "b", &[(5, 2), (6, 1), (900, 1), (10, 2)], Some("a"));
    let third = [(5, 2), (6, 3), (10, 2), (400, 3)];
    (checkpoint(root, "c", &third, Some("b")), third)
}

#[test]
fn a_chain_of_diffs_flattens_to_the_newest_content() {
    let root = tempfile::tempdir().unwrap();
    let root = root.path();
    let (c, third) = three_deep(root);
    assert_eq!(Chain::open(root, &c).unwrap().unwrap().depth(), 3);
    assert_eq!(read_chain(root, "c"), expected(&third));

    let flat = flatten(root, &c).unwrap();
    assert_eq!(flat.ram, RamImage::File);
    assert_eq!(flat.ram_base, None);
    assert!(!c.join(PAGES_FILE).exists());
    assert_eq!(flat.ram_bytes, 4 * PAGE as u64, "zero pages stay holes");
    assert_eq!(read_manifest(&c).unwrap(), flat);
    assert_eq!(Chain::open(root, &c).unwrap().unwrap().depth(), 1);
    assert_eq!(read_chain(root, "c"), expected(&third));
    // Its bases are untouched, and a second flatten does nothing.
    assert_eq!(
        read_chain(root, "b"),
        expected(&[(5, 2), (6, 1), (900, 1), (10, 2)])
    );
    assert_eq!(flatten(root, &c).unwrap(), flat);
}

#[test]
fn a_base_is_chosen_per_vm_and_chains_stay_short() {
    let root = tempfile::tempdir().unwrap();
    let root = root.path();
    checkpoint(root, "c0", &[(1, 1)], None);
    let mut manifests = vec![read_manifest(&root.join("c0")).unwrap()];
    for level in 1..MAX_CHAIN {
        let id = format!("c{level}");
        let base = format!("c{}", level - 1);
        checkpoint(root, &id, &[(1, 1), (level, 2)], Some(&base));
        let mut manifest = read_manifest(&root.join(&id)).unwrap();
        manifest.created_at_unix_ms = level as u64 + 1;
        write_manifest(&root.join(&id), &manifest).unwrap();
        manifests.push(manifest);
    }
    let len = (PAGES * PAGE) as u64;
    // The newest has a chain of MAX_CHAIN: the next is full.
    assert!(choose_base(root, &manifests, "vm", len).is_none());
    manifests.pop();
    let (id, chain) = choose_base(root, &manifests, "vm", len).unwrap();
    assert_eq!((id.as_str(), chain.depth()), ("c6", MAX_CHAIN - 1));
    assert!(choose_base(root, &manifests, "another-vm", len).is_none());
    assert!(choose_base(root, &manifests, "vm", len * 2).is_none());
}

#[test]
fn a_missing_base_or_a_bad_bitmap_is_damage() {
    let root = tempfile::tempdir().unwrap();
    let root = root.path();
    checkpoint(root, "a", &[(1, 1)], None);
    let b = checkpoint(root, "b", &[(1, 2)], Some("a"));
    fs::write(b.join(PAGES_FILE), b"short").unwrap();
    assert!(matches!(
        Chain::open(root, &b),
        Err(SnapshotError::Damaged { .. })
    ));
    fs::remove_dir_all(root.join("a")).unwrap();
    assert!(matches!(
        Chain::open(root, &b),
        Err(SnapshotError::Damaged { .. })
    ));
    assert!(flatten(root, &b).is_err());
}

#[test]
fn a_diff_takes_in_its_deleted_bases_pages() {
    let root = tempfile::tempdir().unwrap();
    let root = root.path();
    let (c, third) = three_deep(root);
    // b goes: c is based on a, with b's pages it lacked.
    let standing = absorb(&c, &root.join("b")).unwrap().unwrap();
    assert_eq!(standing.ram_base.as_deref(), Some("a"));
    fs::remove_dir_all(root.join("b")).unwrap();
    assert_eq!(read_chain(root, "c"), expected(&third));
    // a goes: c is whole.
    let standing = absorb(&c, &root.join("a")).unwrap().unwrap();
    assert_eq!((standing.ram, standing.ram_base), (RamImage::File, None));
    assert!(!c.join(PAGES_FILE).exists());
    fs::remove_dir_all(root.join("a")).unwrap();
    assert_eq!(read_chain(root, "c"), expected(&third));
}

#[test]
fn a_store_delete_of_a_base_keeps_its_diffs_whole() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("checkpoints");
    let store = super::super::manifest::Store::new(root.clone(), dir.path().join("run"));
    checkpoint(&root, "a", &[(5, 1), (6, 1)], None);
    checkpoint(&root, "b", &[(5, 2), (6, 1), (7, 2)], Some("a"));
    let third = [(5, 2), (6, 3), (7, 2)];
    checkpoint(&root, "c", &third, Some("b"));
    assert!(
        store.find("a").unwrap().users.is_empty(),
        "a diff does not hold its base"
    );
    store.delete("b").unwrap();
    assert_eq!(
        read_manifest(&root.join("c")).unwrap().ram_base.as_deref(),
        Some("a")
    );
    store.delete("a").unwrap();
    assert_eq!(read_manifest(&root.join("c")).unwrap().ram, RamImage::File);
    assert_eq!(read_chain(&root, "c"), expected(&third));
    // A manifest that names another folder is not listed (ids are paths).
    let mut other = read_manifest(&root.join("c")).unwrap();
    other.id = "a".into();
    fs::create_dir_all(root.join("d")).unwrap();
    write_manifest(&root.join("d"), &other).unwrap();
    let ids: Vec<String> = store
        .list()
        .unwrap()
        .into_iter()
        .map(|c| c.manifest.id)
        .collect();
    assert_eq!(ids, vec!["c".to_owned()]);
}

#[test]
fn a_delete_waits_for_no_reader() {
    let root = tempfile::tempdir().unwrap();
    let a = checkpoint(root.path(), "a", &[(1, 1)], None);
    let chain = Chain::open(root.path(), &a).unwrap().unwrap();
    assert!(try_lock_for_delete(&a).unwrap().is_none());
    drop(chain);
    assert!(try_lock_for_delete(&a).unwrap().is_some());
}
