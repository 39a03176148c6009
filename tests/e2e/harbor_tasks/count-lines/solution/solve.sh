#!/bin/bash
seq 1 3 > numbers.txt
