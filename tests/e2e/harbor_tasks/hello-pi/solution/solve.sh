#!/bin/bash
printf '%s' 'harbor-pi-ok' > hello.txt
