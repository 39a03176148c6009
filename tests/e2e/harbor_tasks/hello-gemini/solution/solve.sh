#!/bin/bash
printf '%s' 'harbor-gemini-ok' > hello.txt
