use super::*;

#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct Sample {
    name: String,
    n: u32,
}

#[test]
fn atomic_write_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sub").join("a.json");
    let sample = Sample {
        name: "x".into(),
        n: 3,
    };
    write_atomically(&path, &serde_json::to_vec(&sample).unwrap()).unwrap();
    match load_json::<Sample>(&path).unwrap() {
        Loaded::Ok(back) => assert_eq!(back, sample),
        other => panic!("expected Ok, got {other:?}"),
    }
    // No temp files are left behind.
    let names: Vec<_> = fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
}

#[test]
fn missing_file_is_reported_as_missing() {
    let dir = tempfile::tempdir().unwrap();
    let loaded = load_json::<Sample>(&dir.path().join("nope.json")).unwrap();
    assert!(matches!(loaded, Loaded::Missing));
}

#[test]
fn partially_written_temp_file_never_replaces_good_history() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("conv.json");
    let good = Sample {
        name: "good".into(),
        n: 1,
    };
    write_atomically(&path, &serde_json::to_vec(&good).unwrap()).unwrap();
    // Simulate a crash mid-write: a half-written temp file beside the target.
    let temp = temp_path_for(&path);
    fs::write(&temp, b"{\"name\": \"hal").unwrap();
    assert!(is_temp_file(&temp));
    match load_json::<Sample>(&path).unwrap() {
        Loaded::Ok(back) => assert_eq!(back, good),
        other => panic!("good file must still load, got {other:?}"),
    }
    remove_stale_temp_files(dir.path());
    assert!(!temp.exists());
    assert!(path.exists());
}

#[test]
fn failed_write_leaves_target_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("conv.json");
    write_atomically(&path, b"{\"name\":\"good\",\"n\":1}").unwrap();
    // Renaming a file over a directory fails: the write must fail and keep the old content.
    let blocked = dir.path().join("blocked");
    fs::create_dir(&blocked).unwrap();
    fs::write(blocked.join("inner"), b"x").unwrap();
    assert!(write_atomically(&blocked, b"new").is_err());
    assert_eq!(fs::read(&path).unwrap(), b"{\"name\":\"good\",\"n\":1}");
    let leftovers: Vec<_> = fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| is_temp_file(&e.as_ref().unwrap().path()))
        .collect();
    assert!(leftovers.is_empty());
}

#[test]
fn corrupt_file_is_set_aside_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("conv.json");
    fs::write(&path, b"{ not json").unwrap();
    match load_json::<Sample>(&path).unwrap() {
        Loaded::SetAside { reason, moved_to } => {
            assert!(!reason.is_empty());
            assert!(moved_to.exists());
            assert!(moved_to
                .file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("conv.json.corrupt-"));
            assert_eq!(fs::read(&moved_to).unwrap(), b"{ not json");
        }
        other => panic!("expected SetAside, got {other:?}"),
    }
    assert!(!path.exists());
}

#[test]
fn background_writer_finishes_queued_jobs_on_drop() {
    let dir = tempfile::tempdir().unwrap();
    let writer = BackgroundWriter::spawn().unwrap();
    for i in 0..20 {
        writer.submit(WriteJob::Write {
            path: dir.path().join(format!("{i}.json")),
            bytes: b"{}".to_vec(),
        });
    }
    writer.submit(WriteJob::Remove {
        path: dir.path().join("0.json"),
    });
    drop(writer);
    assert!(!dir.path().join("0.json").exists());
    assert!(dir.path().join("19.json").exists());
}
