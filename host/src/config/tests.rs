//! Parsing runner.toml from strings: defaults, every validated field, and one-line errors naming the culprit.

use super::*;

#[test]
fn shipped_runner_toml_parses() {
    let c = Config::parse(include_str!("../../../runner.toml"), "runner.toml").unwrap();
    assert!(c.redis.managed);
    assert!(c.types.contains_key(&"order.timeout".parse().unwrap()));
}

#[test]
fn empty_config_has_defaults() {
    let c = Config::parse("", "runner.toml").unwrap();
    assert_eq!(c.redis.prefix.as_str(), "hourglass");
    assert_eq!(c.runner.lease, Duration::from_secs(30));
    assert_eq!(c.defaults.max_attempts, 5);
}

#[test]
fn type_overrides_fall_back_to_defaults() {
    let c = Config::parse(
        r#"
        [defaults]
        max_attempts = 3
        timeout = "2s"
        [types."order.timeout"]
        max_attempts = 7
        memory_limit = "32MiB"
        config = { url = "http://x" }
        "#,
        "runner.toml",
    )
    .unwrap();
    let t: TaskType = "order.timeout".parse().unwrap();
    let p = c.policy(&t);
    assert_eq!(p.max_attempts, 7);
    assert_eq!(p.timeout, Duration::from_secs(2));
    assert_eq!(p.memory_limit, ByteSize::mib(32));
    assert_eq!(c.types[&t].config["url"], "http://x");
    assert_eq!(c.policy(&"other".parse().unwrap()).max_attempts, 3);
}

#[test]
fn shards_are_validated() {
    let c = Config::parse("[types.hot]\nshards = 3\nmax_running = 7\nrate = \"30/s\"\n", "runner.toml").unwrap();
    let hot: TaskType = "hot".parse().unwrap();
    assert_eq!((c.shards(&hot), c.shards(&hot.shard(2)), c.shards(&"cold".parse().unwrap())), (3, 3, 1));
    assert_eq!(c.policy(&hot.shard(2)), c.policy(&hot), "a shard has its type's policy");
    let p = c.policy(&hot);
    let parts: Vec<_> = (0..3).map(|i| p.shard_limits(i, 3)).collect();
    assert_eq!(parts.iter().map(|(m, _)| m).sum::<u64>(), 7, "max_running splits without loss: {parts:?}");
    assert_eq!(parts.iter().map(|(_, r)| r.unwrap().per_second()).sum::<f64>(), 30.0);
    assert_eq!(p.shard_limits(0, 1), (7, p.rate), "one shard keeps the whole limit");
    for (text, error) in [
        ("shards = 0", "shards must be between 1 and 256"),
        ("shards = 257", "shards must be between 1 and 256"),
        ("shards = 4\nmax_running = 3", "max_running = 3 is less than its 4 shards"),
    ] {
        let e = format!("{:#}", Config::parse(&format!("[types.hot]\n{text}\n"), "runner.toml").unwrap_err());
        assert!(e.contains(error), "{text}: {e}");
    }
}

#[test]
fn rates_and_schedules_parse() {
    let c = Config::parse(
        "[types.w]\nrate = \"200/s\"\nmax_running = 5\n\
         [schedules.\"daily-digest\"]\ntype = \"digest.send\"\ncron = \"0 7 * * *\"\ntimezone = \"Europe/Paris\"\npayload = \"hi\"\n\
         [schedules.ping]\ntype = \"noop\"\nevery = \"15m\"\nmissed = \"skip\"\n",
        "runner.toml",
    )
    .unwrap();
    let p = c.policy(&"w".parse().unwrap());
    assert_eq!(p.rate.unwrap().per_second(), 200.0);
    assert_eq!(p.rate.unwrap().burst(), 10.0);
    assert_eq!(p.max_running, 5);
    assert_eq!(Rate::try_from("6/m".to_owned()).unwrap().burst(), 1.0);
    assert_eq!(c.schedules.len(), 2);
}

#[test]
fn follow_up_grants_are_per_type_and_fall_back_to_defaults() {
    let c = Config::parse(
        "[defaults]\nmay_schedule = [\"audit\"]\n\
         [types.\"device.offline\"]\nmay_schedule = [\"device.alert\"]\nmay_replace = [\"device.offline\"]\n",
        "runner.toml",
    )
    .unwrap();
    let p = c.policy(&"device.offline".parse().unwrap());
    assert_eq!(p.may_schedule, vec!["device.alert".parse::<TaskType>().unwrap()]);
    assert_eq!(p.may_replace, vec!["device.offline".parse::<TaskType>().unwrap()]);
    let other = c.policy(&"other".parse().unwrap());
    assert_eq!(other.may_schedule, vec!["audit".parse::<TaskType>().unwrap()]);
    assert!(other.may_replace.is_empty());
    assert!(
        Config::parse("", "runner.toml").unwrap().defaults.may_schedule.is_empty(),
        "nothing is granted by default"
    );
}

#[test]
fn unknown_key_names_key_and_line() {
    let err = Config::parse("[runner]\n\nconcurency = 4\n", "runner.toml").unwrap_err();
    let msg = format!("{err:#}");
    assert!(msg.starts_with("runner.toml:3:"), "{msg}");
    assert!(msg.contains("concurency"), "{msg}");
    assert!(!msg.contains('\n'), "{msg}");
}

#[test]
fn bad_type_name_is_refused() {
    let err = Config::parse("[types.\"Bad Name\"]\n", "runner.toml").unwrap_err();
    assert!(format!("{err:#}").contains("invalid task type"), "{err:#}");
}

#[test]
fn bad_values_are_refused() {
    for (text, needle) in [
        ("[runner]\nconcurrency = 0", "runner.concurrency"),
        ("[runner]\nlease = \"10ms\"", "runner.lease"),
        ("[runner]\nlease = \"soon\"", "runner.toml:2"),
        ("[defaults]\nmax_attempts = 0", "defaults.max_attempts"),
        ("[types.a]\nbackoff_base = \"1h\"\nbackoff_cap = \"1s\"", "types.\"a\".backoff_cap"),
        ("[redis]\nprefix = \"a{b\"", "invalid key prefix"),
        ("[runner]\nwakeup = \"sometimes\"", "runner.toml:2"),
        ("[admin]\nenabled = true\nlisten = \"0.0.0.0:9090\"", "admin.token"),
        ("[admin]\ntoken = \"short\"", "admin.token"),
        ("[admin]\nlisten = \"nowhere\"", "runner.toml:2"),
        ("[defaults]\nevents_maxlen = 0", "defaults.events_maxlen"),
        ("[types.a]\nhost_memory_limit = \"1MiB\"", "types.\"a\".host_memory_limit"),
        ("[types.a]\nrate = \"fast\"", "invalid rate"),
        ("[types.a]\nmay_schedule = [\"Device Alert\"]", "invalid task type \"Device Alert\""),
        ("[types.a]\nmay_schedule = [\"b\", \"b\"]", "types.\"a\".may_schedule lists \"b\" twice"),
        ("[runner]\ncompile_memory_limit = \"1MiB\"", "runner.compile_memory_limit"),
        ("[runner]\ncompile_timeout = \"0s\"", "runner.compile_timeout"),
        ("[runner]\nmax_plugin_size = \"2GiB\"", "runner.max_plugin_size"),
        ("[runner]\ncompile_threads = 0", "runner.compile_threads"),
        ("[runner]\nworker_threads = 1000", "runner.worker_threads"),
        ("[types.a]\nrate = \"0/s\"", "at least 1"),
        ("[schedules.digest]\ntype = \"digest.send\"\ncron = \"0 7 * *\"", "schedules.\"digest\""),
        ("[schedules.digest]\ntype = \"digest.send\"", "schedules.\"digest\""),
        ("[schedules.digest]\ntype = \"digest.send\"\nevery = \"1m\"\ncron = \"* * * * *\"", "schedules.\"digest\""),
        (
            "[schedules.digest]\ntype = \"digest.send\"\ncron = \"0 7 * * *\"\ntimezone = \"Mars/Olympus\"",
            "unknown time zone",
        ),
    ] {
        let err = format!("{:#}", Config::parse(text, "runner.toml").unwrap_err());
        assert!(err.contains(needle), "{text}: {err}");
    }
}

#[test]
fn outbound_http_keys() {
    let c = Config::parse(
        "[defaults]\nhttp_timeout = \"2s\"\n[types.w]\nallowed_outbound_hosts = [\"https://a.example\"]\nhttp_max_response = \"4KiB\"\nhttp_concurrency = 2\n",
        "runner.toml",
    )
    .unwrap();
    let p = c.policy(&"w".parse().unwrap());
    assert_eq!(p.allowed_outbound_hosts.entries().collect::<Vec<_>>(), ["https://a.example"]);
    assert_eq!(p.http_timeout, std::time::Duration::from_secs(2));
    assert_eq!(p.http_max_response, bytesize::ByteSize::kib(4));
    assert_eq!(p.http_concurrency, 2);
    assert!(c.policy(&"other".parse().unwrap()).allowed_outbound_hosts.is_empty());
    for (text, needle) in [
        ("[types.w]\n\nallowed_outbound_hosts = [\"api.example.com\"]", "runner.toml:3"),
        ("[types.w]\nallowed_outbound_hosts = [\"api.example.com\"]", "invalid allowed_outbound_hosts entry"),
        ("[defaults]\nhttp_concurrency = 0", "defaults.http_concurrency"),
        ("[types.w]\nhttp_timeout = \"0s\"", "types.\"w\".http_timeout"),
    ] {
        let err = format!("{:#}", Config::parse(text, "runner.toml").unwrap_err());
        assert!(err.contains(needle), "{text}: {err}");
    }
}

#[test]
fn run_flags_win_over_the_file_and_turn_the_admin_server_on() {
    let mut c = Config::parse("[runner]\nplugins_dir = \"p\"\n", "runner.toml").unwrap();
    assert!(!c.admin.enabled);
    let flags = Overrides {
        plugins_dir: Some("q".into()),
        admin_listen: Some("127.0.0.1:9091".parse().unwrap()),
        redis_url: Some("redis://10.0.0.7:6380".into()),
    };
    flags.apply(&mut c).unwrap();
    assert_eq!((c.runner.plugins_dir.as_path(), c.admin.enabled), (std::path::Path::new("q"), true));
    assert_eq!(c.redis.url, "redis://10.0.0.7:6380");
    assert_eq!(c.admin.listen, "127.0.0.1:9091".parse().unwrap());
    // Nothing given, nothing changed.
    let before = c.clone();
    Overrides::default().apply(&mut c).unwrap();
    assert_eq!((c.runner.plugins_dir, c.admin), (before.runner.plugins_dir, before.admin));
    // A token in the file lets the flag listen beyond loopback; without one the flag is named.
    let mut c = Config::parse("[admin]\ntoken = \"sesame-open-1234\"\n", "runner.toml").unwrap();
    let wide = Overrides { admin_listen: Some("0.0.0.0:9091".parse().unwrap()), ..Overrides::default() };
    wide.apply(&mut c).unwrap();
    let err = format!("{:#}", wide.apply(&mut Config::parse("", "runner.toml").unwrap()).unwrap_err());
    assert!(err.starts_with("--admin-listen") && err.contains("admin.token"), "{err}");
}

#[test]
fn a_key_turned_off_by_another_gets_one_warning_line() {
    let parse = |text: &str| Config::parse(text, "runner.toml").unwrap().ineffective_keys();
    let lines = parse("[admin]\nlisten = \"127.0.0.1:9191\"\n");
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("[admin] listen") && lines[0].contains("enabled = true"), "{}", lines[0]);
    assert!(!lines[0].contains('\n'));
    let both = parse("[admin]\nenabled = false\nlisten = \"127.0.0.1:9191\"\ntoken = \"secret-123\"\n");
    assert!(both[0].contains("listen and token"), "{both:?}");
    assert!(parse("[admin]\nenabled = true\nlisten = \"127.0.0.1:9191\"\n").is_empty());
    assert!(parse("[admin]\nenabled = false\n").is_empty());
    assert!(parse("").is_empty());
}
