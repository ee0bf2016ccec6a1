"""inferbus: ML inference served by actors on the NATS message bus."""
