"""Prometheus metrics of one service process (registry per app, so tests can build several apps)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0, 34.0, 60.0)
DURATION_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0, 120.0, 300.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("vlfleet_requests", "HTTP requests by endpoint and status", ["endpoint", "status"],
                                registry=r)
        self.rejected = Counter("vlfleet_rejected_requests", "Requests refused before inference, by reason",
                                ["reason"], registry=r)
        self.queue_depth = Gauge("vlfleet_queue_depth", "Requests waiting for the inference thread", registry=r)
        self.queue_capacity = Gauge("vlfleet_queue_capacity", "Requests that may wait (VLFLEET_QUEUE_SIZE)",
                                    registry=r)
        self.start_time = Gauge("vlfleet_process_start_time_seconds", "Unix time the service process started",
                                registry=r)
        self.in_flight = Gauge("vlfleet_in_flight_requests", "HTTP requests being served", registry=r)
        self.ttft = Histogram("vlfleet_time_to_first_token_seconds", "Time from request to first token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.duration = Histogram("vlfleet_request_duration_seconds", "Time from request to last token",
                                  buckets=DURATION_BUCKETS, registry=r)
        self.generated_tokens = Counter("vlfleet_generated_tokens", "Output tokens generated", registry=r)
        self.prompt_tokens = Counter("vlfleet_prompt_tokens", "Prompt tokens processed", registry=r)
        self.image_encode = Histogram("vlfleet_image_encode_seconds", "Time to embed the prompt's images and text",
                                      buckets=LATENCY_BUCKETS, registry=r)
        self.vision_encoder_runs = Counter("vlfleet_vision_encoder_runs",
                                           "Images run through the vision encoder (the direct engine keeps encoded "
                                           "images, the genai engines encode every image of every prompt)",
                                           registry=r)
        self.prompt_images = Counter("vlfleet_prompt_images",
                                     "Images in the prompts the engine answered (a conversation's earlier images "
                                     "count again each turn): vision encoder runs over this is the image cache's "
                                     "miss ratio", registry=r)
        self.reused_prompt_tokens = Counter("vlfleet_reused_prompt_tokens",
                                            "Prompt tokens whose KV was kept from an earlier request, not computed",
                                            registry=r)
        self.session_reuse = Counter("vlfleet_session_reuse", "Requests that continued a cached conversation",
                                     registry=r)
        self.cancelled = Counter("vlfleet_cancelled_requests", "Generations stopped because the client went away",
                                 registry=r)
        self.cache_hits = Counter("vlfleet_answer_cache_hits", "Requests answered from the answer cache", registry=r)
        self.cache_misses = Counter("vlfleet_answer_cache_misses", "Cacheable requests not in the answer cache",
                                    registry=r)
        self.cache_bytes = Gauge("vlfleet_answer_cache_bytes", "Bytes held by the answer cache", registry=r)
        self.shed = Counter("vlfleet_shed_requests", "Requests refused because of memory pressure", registry=r)
        self.shedding = Gauge("vlfleet_shedding", "1 while new requests are shed for memory pressure", registry=r)
        self.memory_pressure = Gauge("vlfleet_memory_pressure", "The higher of RSS / limit and host memory in use",
                                     registry=r)
        self.rss = Gauge("vlfleet_process_rss_bytes", "Resident memory of the service process", registry=r)
        self.ready = Gauge("vlfleet_ready", "1 when the model is loaded and warmed up", registry=r)
        self.model = Info("vlfleet_model", "Model and release served by this process", registry=r)
