"""Prometheus metrics of one service process (registry per app, so tests can build several apps)."""

from __future__ import annotations

from functools import partial

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0, 34.0, 60.0)
DURATION_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0, 120.0, 300.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        counter, gauge, histogram, info = (partial(kind, registry=self.registry)
                                           for kind in (Counter, Gauge, Histogram, Info))
        self.requests = counter("vlfleet_requests", "HTTP requests by endpoint and status", ["endpoint", "status"])
        self.rejected = counter("vlfleet_rejected_requests", "Requests refused before inference, by reason", ["reason"])
        self.queue_depth = gauge("vlfleet_queue_depth", "Requests waiting for the inference thread")
        self.queue_capacity = gauge("vlfleet_queue_capacity", "Requests that may wait (VLFLEET_QUEUE_SIZE)")
        self.start_time = gauge("vlfleet_process_start_time_seconds", "Unix time the service process started")
        self.in_flight = gauge("vlfleet_in_flight_requests", "HTTP requests being served")
        self.ttft = histogram("vlfleet_time_to_first_token_seconds",
                              "Time from request to first token", buckets=LATENCY_BUCKETS)
        self.duration = histogram("vlfleet_request_duration_seconds",
                                  "Time from request to last token", buckets=DURATION_BUCKETS)
        self.generated_tokens = counter("vlfleet_generated_tokens", "Output tokens generated")
        self.prompt_tokens = counter("vlfleet_prompt_tokens", "Prompt tokens processed")
        self.image_encode = histogram("vlfleet_image_encode_seconds",
                                      "Time to embed the prompt's images and text", buckets=LATENCY_BUCKETS)
        self.vision_encoder_runs = counter("vlfleet_vision_encoder_runs",
                                           "Images run through the vision encoder (the direct engine keeps encoded "
                                           "images, the genai engines encode every image of every prompt)")
        self.prompt_images = counter("vlfleet_prompt_images",
                                     "Images in the prompts the engine answered (a conversation's earlier images count "
                                     "again each turn): vision encoder runs over this is the image cache's miss ratio")
        self.reused_prompt_tokens = counter("vlfleet_reused_prompt_tokens",
                                            "Prompt tokens whose KV was kept from an earlier request, not computed")
        self.session_reuse = counter("vlfleet_session_reuse", "Requests that continued a cached conversation")
        self.cancelled = counter("vlfleet_cancelled_requests", "Generations stopped because the client went away")
        self.cache_hits = counter("vlfleet_answer_cache_hits", "Requests answered from the answer cache")
        self.cache_misses = counter("vlfleet_answer_cache_misses", "Cacheable requests not in the answer cache")
        self.cache_bytes = gauge("vlfleet_answer_cache_bytes", "Bytes held by the answer cache")
        self.shed = counter("vlfleet_shed_requests", "Requests refused because of memory pressure")
        self.shedding = gauge("vlfleet_shedding", "1 while new requests are shed for memory pressure")
        self.memory_pressure = gauge("vlfleet_memory_pressure", "The higher of RSS / limit and host memory in use")
        self.rss = gauge("vlfleet_process_rss_bytes", "Resident memory of the service process")
        self.ready = gauge("vlfleet_ready", "1 when the model is loaded and warmed up")
        self.model = info("vlfleet_model", "Model and release served by this process")
