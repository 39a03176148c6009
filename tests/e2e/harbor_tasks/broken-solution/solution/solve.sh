#!/bin/bash
# A wrong solution: the verifier must score it 0.0.
printf '%s' 'not-what-was-asked' > hello.txt
