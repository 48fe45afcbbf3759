package bench

import "time"

// Report is everything one bench run measured; it is what -json writes.
type Report struct {
	Version       int       `json:"version"`
	RunID         string    `json:"run_id"`
	Command       string    `json:"command"`
	Started       time.Time `json:"started"`
	Finished      time.Time `json:"finished"`
	Options       *Options  `json:"options"`
	Machine       Machine   `json:"machine"`
	ClockOffsetUs int64     `json:"redis_clock_offset_us"` // Redis's clock minus ours
	ClockRTTUs    int64     `json:"redis_rtt_us"`
	// Consumer says how the bench's consumer consumed (see Options'
	// autoack and prefetch).
	Consumer string `json:"consumer"`
	// DispatcherStamps says whether the instances were started with
	// DISPATCHER_STAMP_PUBLISHED=true: false when the dispatcher does not
	// know the setting (an older binary), and then no dispatch view.
	DispatcherStamps bool       `json:"dispatcher_stamps"`
	Ceilings         []*Ceiling `json:"ceilings"`
	// CPUCap is the cap in force on each instance (-cpu-cap), as read
	// back from the kernel; absent without one.
	CPUCap   *CPUCap         `json:"cpu_cap,omitempty"`
	Results  []*Result       `json:"results"`
	Scale    []*ScaleResult  `json:"scale,omitempty"`
	Idle     []*IdleResult   `json:"idle"`
	Memory   []*MemoryResult `json:"memory,omitempty"`
	Failures []string        `json:"failures"`
	// Compare is -compare's: both sides' runs and their comparison (the
	// lists above are then empty).
	Compare *Comparison `json:"compare,omitempty"`
}

// Result is one backlog or rate point.
type Result struct {
	Point
	Name string `json:"name"` // key prefix, exchange and queue

	Scheduled  int   `json:"scheduled"` // tasks expected at the consumer
	Delivered  int   `json:"delivered"` // of those, received at least once
	Missing    int   `json:"missing"`
	Duplicates int64 `json:"duplicates"`
	Unexpected int64 `json:"unexpected"` // tasks not due during the run, or not the bench's
	Early      int64 `json:"early"`      // received before their due time by Redis's clock
	BadID      int64 `json:"bad_message_id"`
	// BadTaskID counts deliveries of a point with ids whose x-task-id was
	// not their id or whose properties were not theirs, and of a plain
	// point that carried an x-task-id.
	BadTaskID int64 `json:"bad_task_id"`
	Malformed int64 `json:"malformed"`

	LoadSeconds float64 `json:"load_seconds"`
	// StartupMs is from starting the instances to the first receipt
	// (backlog mode).
	StartupMs float64 `json:"startup_ms,omitempty"`
	// Seconds is from the first to the last receipt; PerSec the tasks
	// received per second over it.
	Seconds float64 `json:"seconds"`
	PerSec  float64 `json:"per_sec"`
	Ceiling float64 `json:"ceiling_per_sec,omitempty"`
	Ratio   float64 `json:"ratio,omitempty"`

	// Lateness is consumer receipt minus due time (the consumer view).
	Lateness Dist `json:"lateness"`
	// DispatchLateness is header x-published-us minus due time (the
	// dispatch view): over the first deliveries that carried the header;
	// null when none did.
	DispatchLateness *Dist `json:"dispatch_lateness"`
	// Unstamped counts first deliveries without x-published-us.
	Unstamped int64 `json:"unstamped"`
	// FirstSecond is the start of traffic (rate mode): the tasks due in
	// the first second from the earliest due time; AfterFirstSecond the
	// rest, the steady traffic (what scale mode judges).
	FirstSecond      *Window `json:"first_second,omitempty"`
	AfterFirstSecond *Window `json:"after_first_second,omitempty"`
	// Abandoned counts the tasks a scale step left undelivered when it
	// was cut short as overloaded (not counted as missing).
	Abandoned int `json:"abandoned,omitempty"`

	ShardLateness  []ShardDist `json:"shard_lateness"`
	ShardP99Median float64     `json:"shard_p99_median_ms"`
	ShardP99Worst  float64     `json:"shard_p99_worst_ms"`
	WorstShard     int         `json:"worst_shard"`

	Redis          RedisUse `json:"redis"`
	CmdsPerTask    float64  `json:"redis_cmds_per_task"`
	ScriptsPerTask float64  `json:"redis_script_calls_per_task"`
	// RedisCPUPer10k is Redis's CPU seconds (INFO cpu, every primary,
	// everything the server did in the window) per 10,000 tasks; null
	// when Redis would not tell.
	RedisCPUPer10k *float64 `json:"redis_cpu_seconds_per_10k"`

	// CPUSeconds is user + system time of all instances: over their
	// whole life in backlog mode, from ready to the end in rate mode;
	// CPUSecondsEach each instance's, CPUPer10kEach each instance's per
	// 10,000 tasks (of all delivered).
	CPUSeconds     float64   `json:"cpu_seconds"`
	CPUPer10k      float64   `json:"cpu_seconds_per_10k"`
	CPUSecondsEach []float64 `json:"cpu_seconds_each"`
	CPUPer10kEach  []float64 `json:"cpu_seconds_per_10k_each"`
	PeakRSSMB      float64   `json:"peak_rss_mb"` // the largest VmHWM of any instance
	RSSMB          []float64 `json:"rss_mb"`      // VmHWM of each
	ClaimBatchMean float64   `json:"claim_batch_mean"`
	// CPUPercentEach is each instance's CPU as % of one core over
	// CPUWindowSeconds (the window CPUSecondsEach covers); ThrottleEach
	// what the CPU cap did to each over it (-cpu-cap).
	CPUWindowSeconds float64    `json:"cpu_window_seconds"`
	CPUPercentEach   []float64  `json:"cpu_percent_each"`
	ThrottleEach     []Throttle `json:"throttle_each,omitempty"`
	// DispatchedEach is the tasks each instance dispatched (its
	// dispatcher_tasks_dispatched_total), SharePercentEach its share of
	// all, in %.
	DispatchedEach   []float64 `json:"dispatched_each"`
	SharePercentEach []float64 `json:"share_percent_each"`
	// PublishCalls is the instances' publish calls in all, read from
	// the metric PublishCallsFrom names.
	PublishCalls     float64 `json:"publish_calls"`
	PublishCallsFrom string  `json:"publish_calls_from"`
	// Floor is the AMQP library's floor at the point's cadence (-floor).
	Floor *Floor `json:"floor,omitempty"`
	// cadence is the point's publishing, for a floor measured later.
	cadence *cadence

	// Burst is a burst point's own figures.
	Burst *BurstResult `json:"burst,omitempty"`
	// Ingress is an ingress point's own figures.
	Ingress *IngressResult `json:"ingress,omitempty"`

	Errors []string `json:"errors,omitempty"`
}

// IdleResult is one idle point: K instances with nothing due.
type IdleResult struct {
	Point
	Name    string  `json:"name"`
	Seconds float64 `json:"seconds"`
	// CmdsPerSec is every command Redis ran per second (inside scripts
	// too); ScriptsPerSec the script calls among them.
	CmdsPerSec            float64 `json:"redis_cmds_per_sec"`
	CmdsPerSecPerInstance float64 `json:"redis_cmds_per_sec_per_instance"`
	ScriptsPerSec         float64 `json:"redis_script_calls_per_sec"`
	// RedisCPUPercent is Redis's CPU (INFO cpu, every primary) as % of
	// one core: everything the server did in the window; null when
	// Redis would not tell.
	RedisCPUPercent *float64 `json:"redis_cpu_percent"`
	// CPUPercent is the instances' mean CPU as % of one core;
	// CPUPercentEach each instance's.
	CPUPercent     float64   `json:"cpu_percent_per_instance"`
	CPUPercentEach []float64 `json:"cpu_percent_each"`
	PeakRSSMB      float64   `json:"peak_rss_mb"`
	Redis          RedisUse  `json:"redis"`
	Unexpected     int64     `json:"unexpected"` // tasks dispatched although none was due
	Errors         []string  `json:"errors,omitempty"`
}

// Window is the lateness of the tasks due within a span of the run.
type Window struct {
	// FromDueMs is the earliest due time (Redis clock, ms since the
	// epoch); the window holds the tasks due in [FromDueMs, FromDueMs+Ms).
	FromDueMs int64 `json:"from_due_ms"`
	Ms        int64 `json:"ms"`
	Tasks     int   `json:"tasks"`
	// Lateness is the consumer view, DispatchLateness the dispatch view
	// (null when no task in the window carried x-published-us).
	Lateness         Dist  `json:"lateness"`
	DispatchLateness *Dist `json:"dispatch_lateness"`
}

// failures lists what makes the run fail.
func (res *Result) failures() []string {
	var out []string
	add := func(n int64, what string) {
		if n > 0 {
			out = append(out, res.Point.String()+": "+thousands(int(n))+" "+what)
		}
	}
	add(int64(res.Missing), "missing")
	add(res.Duplicates, "duplicates")
	add(res.Unexpected, "unexpected (not due yet, or not the bench's)")
	add(res.Early, "early (before their due time by Redis's clock)")
	add(res.BadID, "with a message_id that does not match the contract")
	add(res.BadTaskID, "with a wrong x-task-id or properties")
	add(res.Malformed, "malformed")
	for _, e := range res.Errors {
		out = append(out, res.Point.String()+": "+e)
	}
	return out
}
