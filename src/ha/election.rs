//! The election task: one term per etcd lease. A term grants a lease,
//! keeps it alive, campaigns with it (etcd's `Campaign` returns once every
//! earlier campaigner's key is gone), leads once it wins, and ends when the
//! lease is lost, may have run out, or etcd fails; then a new term begins.
//!
//! Fencing: the lease runs at least until the moment a renewal was sent
//! plus the TTL etcd answered (etcd restarts the TTL when it receives the
//! renewal, later). The fence is set that far, less a margin, and a term
//! ends when that moment passes unrenewed, so this instance has stopped
//! granting before etcd can expire the lease and let another instance win.

use std::{pin::pin, time::Duration};

use super::{
    HaSettings, Leadership,
    connection::{ConnectError, EtcdConnection},
    etcd::{
        etcdserverpb::{
            LeaseGrantRequest, LeaseKeepAliveRequest, LeaseRevokeRequest, lease_client::LeaseClient,
        },
        v3electionpb::{
            CampaignRequest, LeaderKey, LeaderRequest, ResignRequest,
            election_client::ElectionClient,
        },
    },
    failsafe::{fence_after_round, renewal_overdue},
    failsafe_peers::{FailsafeState, ask_all, follow_members},
    saved_state::{self, LeaderTerm},
};
use std::sync::{Arc, Mutex, PoisonError, atomic::Ordering};
use tokio::{
    sync::{mpsc, watch},
    task::JoinHandle,
    time::{Instant, sleep, sleep_until, timeout},
};

pub use super::connection::LOG;

/// Renewals sent per TTL: one lost renewal still leaves two chances.
const RENEWALS_PER_TTL: u32 = 3;
/// The fence keeps 1/this of the TTL in hand: the margin for the two
/// clocks' rates and the moment etcd takes to act on an expiry.
const FENCE_MARGIN_DIVISOR: u32 = 10;
/// Each unary call but `Campaign` (which waits for the election).
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// Between two terms, and between two tries to observe the election.
const RETRY_PAUSE: Duration = Duration::from_millis(300);
/// Before trying again credentials etcd refused: an operator must act on
/// etcd's users, so the error is not repeated several times a second.
const REFUSED_PAUSE: Duration = Duration::from_secs(10);
/// How often a leader looks at when a balancer last checked it.
const UNCHECKED_POLL: Duration = Duration::from_millis(100);

/// The running election; [`Election::resign`] ends it.
#[derive(Debug)]
pub struct Election {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Election {
    /// Campaigns for `leadership` on etcd until resigned; `leadership`
    /// acts on each win (restarting the engine unless it was taking over).
    pub fn start(settings: HaSettings, leadership: Leadership) -> Election {
        let (stop, stopping) = watch::channel(false);
        tracing::info!(
            target: LOG,
            "campaigning as {:?} in election {:?} on etcd {}, lease {} s",
            settings.instance,
            settings.election_name,
            settings.endpoints.join(","),
            settings.lease_ttl.as_secs()
        );
        let task = tokio::spawn(run(settings, leadership, stopping));
        Election { stop, task }
    }

    /// Stops serving, resigns (so a standby takes over at once rather than
    /// after the TTL) and gives the lease back; bounded in time.
    pub async fn resign(self) {
        let _ = self.stop.send(true);
        let mut task = self.task;
        if timeout(CALL_TIMEOUT * 2, &mut task).await.is_err() {
            task.abort();
        }
    }
}

/// Before the election starts: an error if the first etcd endpoint that
/// answers refuses this instance's user or password. Unreachable endpoints
/// are no error (etcd may come up later; the election retries).
pub async fn check_credentials(settings: &HaSettings) -> Result<(), String> {
    if settings.access.credentials.is_none() {
        return Ok(());
    }
    for url in &settings.endpoints {
        match EtcdConnection::open(url, &settings.access).await {
            Ok(_) => return Ok(()),
            Err(ConnectError::Refused(why)) => return Err(why),
            Err(ConnectError::Unreachable(why)) => tracing::warn!(target: LOG, "{why}"),
        }
    }
    Ok(())
}

/// Why a term ended.
enum Ended {
    Resigned,
    /// The lease is gone or may be: start over with a new one.
    LeaseLost(String),
    /// etcd failed or refused: try the next endpoint.
    Failed(String),
    /// etcd refused this instance's credentials: an operator must act.
    Refused(String),
}

async fn run(settings: HaSettings, leadership: Leadership, mut stop: watch::Receiver<bool>) {
    // One for the whole run: a confirmation holds this instance off across
    // its terms.
    if let Some(secret) = &settings.failsafe_secret {
        let every = settings.lease_ttl / RENEWALS_PER_TTL;
        leadership.enable_failsafe(Arc::new(FailsafeState::new(
            secret.0.clone(),
            settings.instance.clone(),
            settings.lease_ttl,
            // A standby renews every period: one whose last answer is older
            // no longer reaches etcd, and confirms before the leader's
            // fence (at least TTL - period - margin ahead then) closes.
            every,
        )));
        tracing::info!(target: LOG, "failsafe on: a leader goes on while every instance confirms");
    }
    let mut endpoint = 0;
    // A lease of an earlier term that was not given back.
    let mut stale_lease = None;
    loop {
        let url = &settings.endpoints[endpoint % settings.endpoints.len()];
        let ended = term(&settings, &leadership, &mut stop, url, &mut stale_lease).await;
        leadership.set_campaigning(false);
        leadership.0.won_waiting.store(false, Ordering::Release);
        let was_leading = leadership.role().is_leader();
        leadership.stand_by(None);
        let pause = if matches!(ended, Ended::Refused(_)) {
            REFUSED_PAUSE
        } else {
            RETRY_PAUSE
        };
        match ended {
            Ended::Resigned => return,
            Ended::LeaseLost(why) if was_leading => {
                tracing::warn!(target: LOG, "stepped down: {why}");
            }
            Ended::LeaseLost(why) => tracing::info!(target: LOG, "new lease: {why}"),
            Ended::Failed(why) => {
                let level_warn = was_leading;
                if level_warn {
                    tracing::warn!(target: LOG, "stepped down: {why}");
                } else {
                    tracing::info!(target: LOG, "{why}");
                }
                endpoint += 1;
            }
            Ended::Refused(why) => {
                tracing::error!(target: LOG, "not campaigning: {why}");
                endpoint += 1;
            }
        }
        tokio::select! {
            () = sleep(pause) => {}
            _ = stop.changed() => return,
        }
    }
}

/// Aborts a helper task when its term ends.
struct Helper(JoinHandle<()>);

impl Drop for Helper {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What the renewer saw.
enum Renewal {
    /// etcd renewed the lease for `ttl` seconds on a request sent at `sent`.
    Renewed { sent: Instant, ttl: i64 },
    /// etcd says the lease no longer exists.
    Gone,
}

/// A proclamation of the election's leader.
struct Observed {
    key: Vec<u8>,
    value: String,
    /// The lease the leader's key lives on.
    lease: i64,
}

async fn term(
    settings: &HaSettings,
    leadership: &Leadership,
    stop: &mut watch::Receiver<bool>,
    url: &str,
    stale_lease: &mut Option<i64>,
) -> Ended {
    let etcd = match EtcdConnection::open(url, &settings.access).await {
        Ok(etcd) => etcd,
        Err(ConnectError::Unreachable(why)) => return Ended::Failed(why),
        Err(ConnectError::Refused(why)) => return Ended::Refused(why),
    };
    let (lease_id, granted_ttl, asked) =
        match fresh_lease(&etcd, settings.lease_ttl, url, stale_lease).await {
            Ok(granted) => granted,
            Err(ended) => return ended,
        };
    leadership.set_campaigning(true);
    let margin = |ttl: i64| {
        let ttl = Duration::from_secs(ttl.max(0) as u64);
        ttl - ttl / FENCE_MARGIN_DIVISOR
    };
    let mut lease_until = asked + margin(granted_ttl);
    let every = Duration::from_secs(granted_ttl as u64) / RENEWALS_PER_TTL;

    let (renewed, mut renewals) = mpsc::channel(4);
    let _renewer = Helper(tokio::spawn(renew(
        etcd.clone(),
        lease_id,
        every,
        renewed,
        leadership.clone(),
    )));
    let name = settings.election_name.as_bytes().to_vec();
    let (observed, mut observations) = mpsc::channel(4);
    let _observer = Helper(tokio::spawn(observe(etcd.clone(), name.clone(), observed)));
    let request = CampaignRequest {
        name: name.clone(),
        lease: lease_id,
        value: settings.instance.as_bytes().to_vec(),
    };
    let mut campaign = pin!(etcd.call(move |service| {
        let request = request.clone();
        async move { ElectionClient::new(service).campaign(request).await }
    }));
    let failsafe = leadership.failsafe().cloned();
    let known = Arc::new(Mutex::new(Vec::new()));
    let _members = failsafe.as_ref().map(|_| {
        Helper(tokio::spawn(follow_members(
            etcd.clone(),
            settings.election_name.clone(),
            settings.instance.clone(),
            every,
            known.clone(),
        )))
    });
    let mut failsafe_round = tokio::time::interval(every / 2);
    let mut in_failsafe = false;
    // Won, but held off by a failsafe confirmation until then.
    let mut held: Option<(LeaderKey, Instant)> = None;
    let mut campaigning = true;
    let mut leading: Option<LeaderKey> = None;
    let mut unchecked = tokio::time::interval(UNCHECKED_POLL);
    loop {
        tokio::select! {
            _ = failsafe_round.tick(), if leading.is_some() && failsafe.is_some() => {
                let Some(state) = &failsafe else { continue };
                let asked = Instant::now();
                if !renewal_overdue(asked, lease_until, margin(granted_ttl), every) {
                    in_failsafe = false;
                    continue;
                }
                let members = known.lock().unwrap_or_else(PoisonError::into_inner).clone();
                let answers = ask_all(state, &members).await;
                match fence_after_round(asked, margin(granted_ttl), &members, &answers) {
                    Some(fence) => {
                        if !in_failsafe {
                            tracing::warn!(
                                target: LOG,
                                "etcd does not renew the lease: leading on in failsafe, {} confirmed",
                                members.join(", ")
                            );
                        }
                        in_failsafe = true;
                        lease_until = lease_until.max(fence);
                        leadership.extend(lease_until);
                    }
                    None if in_failsafe || members.is_empty() => {
                        in_failsafe = false;
                        tracing::warn!(
                            target: LOG,
                            "failsafe ends: not every instance confirmed ({answers:?} of {members:?}); \
                             stepping down when the lease may run out"
                        );
                    }
                    None => {}
                }
            }
            () = sleep_until(held.as_ref().map_or(lease_until, |(_, until)| *until)), if held.is_some() => {
                if let Some(until) = failsafe.as_ref().and_then(|state| state.hold_until()) {
                    if let Some((_, held_until)) = &mut held {
                        *held_until = until;
                    }
                    continue;
                }
                let Some((key, _)) = held.take() else { continue };
                leadership.0.won_waiting.store(false, Ordering::Release);
                let office = Office { settings, leadership, etcd: &etcd, lease_id, lease_until };
                if let Err(ended) = take_office(office, key.clone()).await {
                    return ended;
                }
                leading = Some(key);
            }
            _ = unchecked.tick(), if leading.is_some() && settings.resign_unchecked_after.is_some() => {
                let after = settings.resign_unchecked_after.unwrap_or_default();
                if leadership.unchecked_for() < after {
                    continue;
                }
                // Cut off from the balancer (so from the daemons): the
                // standby they reach leads instead. A new term campaigns
                // behind it.
                leadership.stand_by(None);
                resign(&etcd, leading.take(), lease_id, stale_lease).await;
                tracing::warn!(
                    target: LOG,
                    "stepped down: no balancer asked /readyz for {} ms; resigned",
                    after.as_millis()
                );
                return Ended::LeaseLost("resigned as a leader no balancer reaches".to_owned());
            }
            _ = stop.changed() => {
                leadership.stand_by(None);
                resign(&etcd, leading, lease_id, stale_lease).await;
                tracing::info!(target: LOG, "resigned");
                return Ended::Resigned;
            }
            () = sleep_until(lease_until) => {
                return Ended::LeaseLost(format!(
                    "the lease was not renewed in time and may have expired (etcd at {url})"
                ));
            }
            Some(renewal) = renewals.recv() => match renewal {
                Renewal::Renewed { sent, ttl } => {
                    lease_until = lease_until.max(sent + margin(ttl));
                    leadership.extend(lease_until);
                }
                Renewal::Gone => return Ended::LeaseLost("etcd says the lease expired".to_owned()),
            },
            won = &mut campaign, if campaigning => {
                campaigning = false;
                let key = match won {
                    Ok(won) => won.into_inner().leader,
                    Err(status) => return Ended::Failed(format!("campaign failed: {status}")),
                };
                let Some(key) = key else {
                    return Ended::Failed("etcd answered the campaign without a leader key".to_owned());
                };
                if let Some(until) = failsafe.as_ref().and_then(|state| state.hold_until()) {
                    // It confirmed to a failsafe leader: that leader may
                    // grant until then.
                    leadership.0.won_waiting.store(true, Ordering::Release);
                    tracing::info!(
                        target: LOG,
                        "won; leading in {} ms, once the failsafe leader it confirmed to has stopped",
                        until.saturating_duration_since(Instant::now()).as_millis()
                    );
                    held = Some((key, until));
                    continue;
                }
                let office = Office { settings, leadership, etcd: &etcd, lease_id, lease_until };
                if let Err(ended) = take_office(office, key.clone()).await {
                    return ended;
                }
                leading = Some(key);
            }
            Some(seen) = observations.recv() => match &leading {
                Some(key) if key.key != seen.key => {
                    return Ended::LeaseLost(format!("etcd names another leader, {}", seen.value));
                }
                Some(_) => {}
                // This instance's own key (this term's, which etcd may name
                // before the campaign returns, or an earlier term's): not a
                // leader to follow, nor one to name as the leader that does
                // not answer while taking over.
                None if seen.lease == lease_id || seen.value == settings.instance => {}
                None => leadership.stand_by(Some(seen.value)),
            },
        }
    }
}

/// A fresh lease for a term, once the previous term's lease (whose key would
/// hold the election until its TTL ran out) is revoked: its id, the TTL etcd
/// granted and when it was asked for.
async fn fresh_lease(
    etcd: &EtcdConnection,
    ttl: Duration,
    url: &str,
    stale_lease: &mut Option<i64>,
) -> Result<(i64, i64, Instant), Ended> {
    if let Some(id) = *stale_lease
        && let Ok(Ok(_)) = timeout(CALL_TIMEOUT, revoke(etcd, id)).await
    {
        *stale_lease = None;
    }
    let asked = Instant::now();
    let request = LeaseGrantRequest {
        ttl: ttl.as_secs().max(1) as i64,
        id: 0,
    };
    let grant =
        etcd.call(|service| async move { LeaseClient::new(service).lease_grant(request).await });
    let granted = match timeout(CALL_TIMEOUT, grant).await {
        Ok(Ok(granted)) => granted.into_inner(),
        Ok(Err(status)) => return Err(Ended::Failed(format!("etcd refused a lease: {status}"))),
        Err(_) => {
            return Err(Ended::Failed(format!(
                "etcd at {url} did not grant a lease in time"
            )));
        }
    };
    if granted.ttl <= 0 || !granted.error.is_empty() {
        return Err(Ended::Failed(format!(
            "etcd refused a lease: {}",
            granted.error
        )));
    }
    *stale_lease = Some(granted.id);
    Ok((granted.id, granted.ttl, asked))
}

/// Gives the election up: resigns the key if leading, revokes the lease.
async fn resign(
    etcd: &EtcdConnection,
    leading: Option<LeaderKey>,
    lease_id: i64,
    stale_lease: &mut Option<i64>,
) {
    if let Some(key) = leading {
        let resign = etcd.call(|service| {
            let request = ResignRequest {
                leader: Some(key.clone()),
            };
            async move { ElectionClient::new(service).resign(request).await }
        });
        let _ = timeout(CALL_TIMEOUT, resign).await;
    }
    if let Ok(Ok(_)) = timeout(CALL_TIMEOUT, revoke(etcd, lease_id)).await {
        *stale_lease = None;
    }
}

async fn revoke(etcd: &EtcdConnection, id: i64) -> Result<(), tonic::Status> {
    etcd.call(|service| async move {
        LeaseClient::new(service)
            .lease_revoke(LeaseRevokeRequest { id })
            .await
    })
    .await
    .map(drop)
}

/// What a won campaign leads with.
struct Office<'a> {
    settings: &'a HaSettings,
    leadership: &'a Leadership,
    etcd: &'a EtcdConnection,
    lease_id: i64,
    lease_until: Instant,
}

/// After a won campaign: leads if etcd names this key under a lease that
/// still runs, with the state the leader before saved restored first.
async fn take_office(office: Office<'_>, key: LeaderKey) -> Result<(), Ended> {
    let Office {
        settings,
        leadership,
        etcd,
        lease_id,
        lease_until,
    } = office;
    let name = settings.election_name.as_bytes().to_vec();
    // Campaign also returns if this lease died while it waited:
    // lead only if etcd names this key, and the lease still runs.
    let leader = etcd.call(|service| {
        let request = LeaderRequest { name: name.clone() };
        async move { ElectionClient::new(service).leader(request).await }
    });
    let named = timeout(CALL_TIMEOUT, leader).await;
    let ours = matches!(&named, Ok(Ok(answer))
        if answer.get_ref().kv.as_ref().is_some_and(|kv| kv.key == key.key && kv.lease == lease_id));
    // What the leader before saved, restored before any grant:
    // a failover never undoes an operator's action.
    let term = LeaderTerm {
        etcd: etcd.clone(),
        leader: key.clone(),
        key: saved_state::key(&settings.election_name),
    };
    if ours && let Err(why) = restore_saved_state(leadership, &term).await {
        return Err(Ended::Failed(format!(
            "won, but cannot restore the saved state: {why}"
        )));
    }
    if !ours || Instant::now() >= lease_until {
        return Err(Ended::LeaseLost(
            "won a campaign whose lease may have expired".to_owned(),
        ));
    }
    leadership.set_term(Some(term));
    leadership.lead(lease_until);
    Ok(())
}

/// Reads the saved state and hands it to the keeper, if there is one.
async fn restore_saved_state(leadership: &Leadership, term: &LeaderTerm) -> Result<(), String> {
    let Some(keeper) = leadership.keeper() else {
        return Ok(());
    };
    let saved = saved_state::read(&term.etcd, term.key.clone()).await?;
    keeper.restore_saved(saved.as_deref())?;
    tracing::info!(
        target: LOG,
        "restored the saved state ({} bytes)",
        saved.map_or(0, |saved| saved.len())
    );
    Ok(())
}

/// Keeps the lease alive: a renewal every `every` on one `LeaseKeepAlive`
/// stream (opened again when it breaks), each answer reported with the
/// time its request was sent.
async fn renew(
    etcd: EtcdConnection,
    id: i64,
    every: Duration,
    events: mpsc::Sender<Renewal>,
    leadership: Leadership,
) {
    loop {
        let (requests, queued) = mpsc::channel(1);
        let mut sent = Some(Instant::now());
        // etcd answers the stream's headers with its first renewal, so the
        // request goes first.
        let _ = requests.try_send(LeaseKeepAliveRequest { id });
        let stream = futures_util::stream::unfold(queued, |mut queued| async move {
            queued.recv().await.map(|request| (request, queued))
        });
        let opened_by = Instant::now() + every;
        let mut lease = LeaseClient::new(etcd.service());
        let mut answers = match timeout(every, lease.lease_keep_alive(stream)).await {
            Ok(Ok(answers)) => answers.into_inner(),
            // The stream's requests are spent: a new token, then a new stream.
            Ok(Err(status)) if etcd.renews_token_for(&status).await => continue,
            _ => {
                sleep_until(opened_by).await;
                continue;
            }
        };
        let mut tick = tokio::time::interval_at(opened_by, every);
        loop {
            tokio::select! {
                answer = answers.message() => match answer {
                    Ok(Some(answer)) => {
                        let Some(at) = sent.take() else { continue };
                        if let Some(stats) = leadership.stats() {
                            stats.renew_latency.observe(at.elapsed().as_secs_f64());
                        }
                        if answer.ttl > 0 {
                            leadership.etcd_answered();
                        }
                        let renewal = if answer.ttl > 0 {
                            Renewal::Renewed { sent: at, ttl: answer.ttl }
                        } else {
                            Renewal::Gone
                        };
                        if events.send(renewal).await.is_err() {
                            return;
                        }
                    }
                    // Broken: open another stream.
                    _ => break,
                },
                _ = tick.tick() => {
                    if sent.is_some() {
                        // Unanswered for a whole period: the stream may be
                        // stuck; a new one is cheaper than waiting.
                        break;
                    }
                    sent = Some(Instant::now());
                    if requests.send(LeaseKeepAliveRequest { id }).await.is_err() {
                        break;
                    }
                }
            }
        }
    }
}

/// Reports every proclamation of the election's leader.
async fn observe(etcd: EtcdConnection, name: Vec<u8>, events: mpsc::Sender<Observed>) {
    loop {
        let observing = etcd.call(|service| {
            let request = LeaderRequest { name: name.clone() };
            async move { ElectionClient::new(service).observe(request).await }
        });
        if let Ok(answers) = observing.await {
            let mut answers = answers.into_inner();
            while let Ok(Some(answer)) = answers.message().await {
                let Some(kv) = answer.kv else { continue };
                let seen = Observed {
                    key: kv.key,
                    value: String::from_utf8_lossy(&kv.value).into_owned(),
                    lease: kv.lease,
                };
                if events.send(seen).await.is_err() {
                    return;
                }
            }
        }
        sleep(RETRY_PAUSE).await;
    }
}
