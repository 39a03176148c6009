from polar.local.cli import main

main()
